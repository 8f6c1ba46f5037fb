"""Golden files for summary text: compare by default, rewrite with `pytest tests/summary --update-golden`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False, help="rewrite tests/summary/golden/*.txt")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Return `check(name, text)`: assert `text` equals golden/<name>.txt, or rewrite it with --update-golden."""
    update = bool(request.config.getoption("--update-golden", default=False))

    def check(name: str, text: str) -> None:
        path = GOLDEN / f"{name}.txt"
        if update:
            path.write_text(text, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"golden file {path.name} is missing; create it with pytest tests/summary --update-golden")
        expected = path.read_text(encoding="utf-8")
        assert text == expected, f"{path.name} differs; if the change is intended, rerun with --update-golden"

    return check
