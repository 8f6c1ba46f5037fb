"""What hookscope exports is what a user imports: every `__all__` name exists, every name a subpackage exports is
shown in the user documentation, and the subpackages together export at most `CEILING` names.

A name is exported when its package's `__all__` lists it; the API reference renders exactly those (mkdocstrings
reads `__all__`), so a name shown only there would document itself. The check reads the pages a user reads
instead: README.md, docs/ (the `:::` directives left out) and examples/, and counts a name only where it stands
as code (a `code span`, a fenced block, an example script) and is not the attribute of something else (`w.save`
does not document `hookscope.steer.save`; `steer.save` does). Names used only inside hookscope (the statistics
engine, the registry, helpers of hooks) are imported by their users from the private module that defines them.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path

import pytest

import hookscope

ROOT = Path(__file__).resolve().parents[2]
CEILING = 145
"""The most names the subpackages' `__all__` may list together (142 today; 315 before issue 23 cut them). A name
exported by a subpackage and by the top level counts once for each."""

INTERNAL = ("hookscope.stats", "hookscope.integrations")
"""Subpackages that export nothing: the statistics engine (users read its statistics through the reducers,
ActivationStats and watch()) and the trainer integrations (imported as their own modules, `.lightning` and
`.transformers`, so that `import hookscope` needs neither trainer)."""


def subpackages() -> list[str]:
    """Every subpackage of hookscope, found on disk (a new one is checked without being listed here)."""
    found = pkgutil.iter_modules(hookscope.__path__, prefix="hookscope.")
    return sorted(info.name for info in found if info.ispkg)


def exports(package: str) -> list[str]:
    names: list[str] = importlib.import_module(package).__all__
    return names


@cache
def documentation() -> str:
    """The code of the pages a user reads: code spans, fenced blocks and example scripts, one text."""
    code: list[str] = []
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = "\n".join(line for line in page.read_text(encoding="utf-8").splitlines() if not line.startswith(":::"))
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
        prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
        code += [*blocks, *re.findall(r"`([^`\n]+)`", prose)]
    code += [script.read_text(encoding="utf-8") for script in sorted((ROOT / "examples").glob("*.py"))]
    return "\n".join(code)


def is_documented(package: str, name: str) -> bool:
    """`name` stands in the documentation's code on its own or as an attribute of its package."""
    short = package.rsplit(".", 1)[1]
    alone = rf"(?<![\w.]){re.escape(name)}(?!\w)"
    qualified = rf"(?<![\w.])(?:hookscope\.)?{re.escape(short)}\.{re.escape(name)}(?!\w)"
    return re.search(f"{alone}|{qualified}", documentation()) is not None


def test_the_subpackages_are_found() -> None:
    assert {"hookscope.hooks", "hookscope.watch", "hookscope.steer", "hookscope.stats"} <= set(subpackages())


@pytest.mark.parametrize("module", ["hookscope", "hookscope.checkpoint", "hookscope.distributed", *subpackages()])
def test_every_exported_name_exists_once(module: str) -> None:
    names = exports(module)
    assert len(names) == len(set(names)), f"{module}.__all__ lists a name twice"
    missing = [name for name in names if not hasattr(importlib.import_module(module), name)]
    assert not missing, f"{module}.__all__ lists names it does not define: {missing}"


def test_the_subpackages_export_at_most_the_ceiling() -> None:
    total = sum(len(exports(package)) for package in subpackages())
    assert 100 <= total <= CEILING, f"the subpackages export {total} names (at most {CEILING}): only what users import"


@pytest.mark.parametrize("package", INTERNAL)
def test_internal_subpackages_export_nothing(package: str) -> None:
    assert exports(package) == []


@pytest.mark.parametrize("package", [p for p in subpackages() if p not in INTERNAL])
def test_every_name_a_subpackage_exports_is_shown_to_users(package: str) -> None:
    names = exports(package)
    assert names, f"{package} exports nothing: list it in INTERNAL, with the reason"
    undocumented = [name for name in names if not is_documented(package, name)]
    assert not undocumented, f"{package} exports names no page shows (document or stop exporting them): {undocumented}"


def test_the_documentation_check_can_fail() -> None:
    """Names the documentation never shows as code, or only as another object's attribute, are not documented."""
    assert documentation().count("\n") > 1000  # the pages were read
    assert is_documented("hookscope.steer", "steering_vector") and is_documented("hookscope.hooks", "Hooks")
    assert not is_documented("hookscope.stats", "describe_segments")  # an engine function no page shows
    assert not is_documented("hookscope.hooks", "REGISTRY")  # named in a docstring, never in a page
    assert not is_documented("hookscope.report", "neutralize")
