"""Golden files for summary text: compare by default, rewrite with `pytest tests/summary --update-golden`.

pytest reads options only from the conftest files of the paths on its command line, so the flag works when
`tests/summary` (or a file in it) is named; `HOOKSCOPE_UPDATE_GOLDEN=1 pytest` does the same from anywhere.
"""

from __future__ import annotations

import os
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
    update = update or os.environ.get("HOOKSCOPE_UPDATE_GOLDEN", "") not in ("", "0")

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
