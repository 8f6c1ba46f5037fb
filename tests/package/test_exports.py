"""What hookscope exports is what a user imports, and each public name has one home: the one `__all__` that lists it.

The rule (issue 23), also written in docs/reference/index.md:
- A name of `hookscope.__all__` (what a user types in the first hour) has the top level as its home: no subpackage's
  `__all__`, and no public module's (`hookscope.checkpoint`, `hookscope.distributed`), lists it again. It still
  imports from its subpackage, as it always has (`from hookscope.monitors import OutputMonitor` is in the seed's
  tests): the subpackage imports it as `name as name`, which type checkers read as a re-export.
- Every other public name has its subpackage as its home (`from hookscope.weights import get_weights`).
- The pages a user reads (README.md, docs/, examples/ and the examples of the docstrings) import a name from its
  home and never name a top-level name through its subpackage (`hookscope.doctor.format_findings`).
- Inside hookscope a name is imported from its home too, and a name whose home is the top level from the private
  module that defines it (the top level imports every package, so nothing inside can import from it); names used
  only inside hookscope (the statistics engine, the registry, helpers of hooks) are imported from the private module
  that defines them, as always.
- The API reference renders each name once: every public package has a page, which renders the names its `__all__`
  lists (mkdocstrings renders exactly those, and the names a module defines); the top level's page renders the
  top-level names, and each subpackage's page links the top-level names it holds. `watch` and `summary` are the
  exception the reference cannot avoid: at the top level their names are also their packages', so the functions
  are rendered on those pages.

Every exported name is also shown in the user documentation: the check reads README.md, docs/ (the `:::` directives
left out) and examples/, and counts a name only where it stands as code (a `code span`, a fenced block, an example
script) and is not the attribute of something else (`w.save` does not document `hookscope.steer.save`;
`steer.save` does). The subpackages together export at most `CEILING` names.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections import Counter
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import hookscope

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CEILING = 90
"""The most names the subpackages' `__all__` may list together: 90 today (142 before the top level's names left
their subpackages' `__all__`, 315 before issue 23 cut them)."""

INTERNAL = ("hookscope.stats", "hookscope.integrations")
"""Subpackages that export nothing and hold no top-level name: the statistics engine (users read its statistics
through the reducers, ActivationStats and watch()) and the trainer integrations (imported as their own modules,
`.lightning` and `.transformers`, so that `import hookscope` needs neither trainer)."""

MODULES = ("hookscope.checkpoint", "hookscope.distributed")
"""The public modules of the top level (not packages): the rule holds for them too."""


def subpackages() -> list[str]:
    """Every subpackage of hookscope, found on disk (a new one is checked without being listed here)."""
    found = pkgutil.iter_modules(hookscope.__path__, prefix="hookscope.")
    return sorted(info.name for info in found if info.ispkg)


def exports(package: str) -> list[str]:
    names: list[str] = importlib.import_module(package).__all__
    return names


def held_by(namespace: str) -> list[str]:
    """The names of `hookscope.__all__` defined inside `namespace` (a subpackage or a public module)."""
    return [
        name
        for name in hookscope.__all__
        if re.fullmatch(rf"{re.escape(namespace)}(\..*)?", getattr(getattr(hookscope, name), "__module__", "") or "")
    ]


def twice_exported(top: list[str], namespaces: dict[str, list[str]]) -> dict[str, list[str]]:
    """`namespace -> names` of the top level's names that another `__all__` lists again (the rule: none)."""
    again = {namespace: sorted(set(names) & set(top)) for namespace, names in namespaces.items()}
    return {namespace: names for namespace, names in again.items() if names}


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


@cache
def docstring_examples() -> str:
    """The `>>>` lines of hookscope's docstrings (the examples the reference shows), one text."""
    lines = (line for path in sorted((SRC / "hookscope").rglob("*.py")) for line in path.read_text().splitlines())
    return "\n".join(line.strip().removeprefix(">>>") for line in lines if line.strip().startswith(">>> "))


def is_documented(package: str, name: str) -> bool:
    """`name` stands in the documentation's code on its own or as an attribute of its package."""
    short = package.rsplit(".", 1)[1]
    alone = rf"(?<![\w.]){re.escape(name)}(?!\w)"
    qualified = rf"(?<![\w.])(?:hookscope\.)?{re.escape(short)}\.{re.escape(name)}(?!\w)"
    return re.search(f"{alone}|{qualified}", documentation()) is not None


def away_from_home(code: str) -> list[str]:
    """The imports and references in `code` that reach a top-level name through a subpackage or public module."""
    found = []
    for module, names in re.findall(r"from\s+(hookscope\.\w+)\s+import\s+(\([^)]*\)|[^\n]+)", code):
        found += [f"from {module} import {name}" for name in re.findall(r"\w+", names) if name in hookscope.__all__]
    for module, name in re.findall(r"(?<![\w.])(hookscope\.\w+)\.(\w+)", code):
        found += [f"{module}.{name}"] if name in hookscope.__all__ else []
    return found


def imports_through_a_package(path: Path, source: str) -> list[str]:
    """The imports of `source` (the module of hookscope at `path`) that take a top-level name from a package's
    `__init__` instead of the private module that defines it."""
    here = list(path.relative_to(SRC).parts[:-1])  # the package a relative import starts from
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = here[: len(here) - (node.level - 1)] if node.level else []
        target = ".".join([*base, *([node.module] if node.module else [])])
        is_package = target.count(".") == 1 and (SRC / target.replace(".", "/")).is_dir()
        is_its_own_init = path.name == "__init__.py" and ".".join(here) == target
        if is_package and not is_its_own_init:
            found += [f"{path.name}:{node.lineno} {a.name}" for a in node.names if a.name in hookscope.__all__]
    return found


def directives() -> list[tuple[str, list[str] | None]]:
    """Every `:::` directive of the API reference: its target and its `members` option (`None`: not given)."""
    found = []
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for target, block in re.findall(r"^::: (\S+)\n((?:[ \t]+\S.*\n)*)", page.read_text(encoding="utf-8"), re.M):
            options = (yaml.safe_load(block) or {}).get("options", {}) if block.strip() else {}
            found.append((target, options.get("members")))
    return found


def resolve(target: str) -> Any:
    """The module or object a directive's target names (`hookscope.watch.watch` is the function)."""
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError:
        parent, name = target.rsplit(".", 1)
        return getattr(importlib.import_module(parent), name)


def rendered(target: str, members: list[str] | None) -> list[tuple[str, Any]]:
    """The functions and classes a directive renders, as mkdocstrings does: an object renders itself; a module the
    names its `__all__` lists and the functions and classes it defines (`members` replaces both), except a name that
    is also one of its subpackages (griffe renders the subpackage there: `hookscope.summary`)."""
    found = resolve(target)
    if not isinstance(found, ModuleType):
        return [(target, found)]
    defined = [n for n, v in vars(found).items() if getattr(v, "__module__", None) == target and not n.startswith("_")]
    names = members if members is not None else [*found.__all__, *defined]
    packages = {info.name for info in pkgutil.iter_modules(getattr(found, "__path__", []))}
    return [
        (f"{target}.{name}", getattr(found, name))
        for name in dict.fromkeys(names)
        if is_documentable(getattr(found, name)) and name not in packages
    ]


def is_documentable(value: Any) -> bool:
    """A class or a function: what the check of the reference follows (constants and type aliases aside)."""
    return inspect.isclass(value) or inspect.isfunction(value)


def test_the_subpackages_are_found() -> None:
    assert {"hookscope.hooks", "hookscope.watch", "hookscope.steer", "hookscope.stats"} <= set(subpackages())


@pytest.mark.parametrize("module", ["hookscope", *MODULES, *subpackages()])
def test_every_exported_name_exists_once(module: str) -> None:
    names = exports(module)
    assert len(names) == len(set(names)), f"{module}.__all__ lists a name twice"
    missing = [name for name in names if not hasattr(importlib.import_module(module), name)]
    assert not missing, f"{module}.__all__ lists names it does not define: {missing}"


def test_the_subpackages_export_at_most_the_ceiling() -> None:
    total = sum(len(exports(package)) for package in subpackages())
    assert total <= CEILING, f"the subpackages export {total} names (at most {CEILING}): only what users import"


def test_a_top_level_name_is_exported_by_the_top_level_only() -> None:
    namespaces = {namespace: exports(namespace) for namespace in [*MODULES, *subpackages()]}
    assert twice_exported(hookscope.__all__, namespaces) == {}
    again = twice_exported(["watch", "Watch"], {"hookscope.watch": ["CSVSink", "Watch"]})  # the check can fail
    assert again == {"hookscope.watch": ["Watch"]}


def test_a_top_level_name_still_imports_from_where_it_always_did() -> None:
    """The seed's imports (`from hookscope.monitors import OutputMonitor`) keep working, for type checkers too."""
    held = {name: namespace for namespace in [*MODULES, *subpackages()] for name in held_by(namespace)}
    assert set(held) == set(hookscope.__all__) - {"HookscopeWarning", "__version__"}  # defined in hookscope/ itself
    assert len(held) == 54  # 52 in subpackages, save_state and load_state in hookscope.checkpoint
    for name, namespace in held.items():
        assert getattr(importlib.import_module(namespace), name) is getattr(hookscope, name), name
        if namespace in MODULES:
            continue  # defined there
        init = ast.parse((SRC / namespace.replace(".", "/") / "__init__.py").read_text(encoding="utf-8"))
        aliases = {
            (a.name, a.asname) for node in ast.walk(init) if isinstance(node, ast.ImportFrom) for a in node.names
        }
        assert (name, name) in aliases, f"{namespace} imports {name} without `as {name}`: type checkers refuse it"


@pytest.mark.parametrize("package", INTERNAL)
def test_internal_subpackages_export_nothing(package: str) -> None:
    assert exports(package) == [] and held_by(package) == []


@pytest.mark.parametrize("package", [p for p in subpackages() if p not in INTERNAL])
def test_every_name_a_subpackage_exports_is_shown_to_users(package: str) -> None:
    names = exports(package)
    assert names or held_by(package), f"{package} exports nothing: list it in INTERNAL, with the reason"
    undocumented = [name for name in names if not is_documented(package, name)]
    assert not undocumented, f"{package} exports names no page shows (document or stop exporting them): {undocumented}"


def test_the_pages_import_each_name_from_its_home() -> None:
    assert away_from_home(documentation()) == []
    assert away_from_home(docstring_examples()) == []


def test_the_home_check_can_fail() -> None:
    code = "from hookscope.reducers import (\n    StatsReducer,\n)\nhookscope.doctor.format_findings(f)\n"
    assert away_from_home(code) == ["from hookscope.reducers import StatsReducer", "hookscope.doctor.format_findings"]
    fine = "from hookscope import StatsReducer\nfrom hookscope.weights import get_weights\nhookscope.summary(m)\n"
    assert away_from_home(fine + "hookscope.hooks.register_module_hook(m)\n") == []


def test_inside_hookscope_a_top_level_name_is_imported_from_its_definition() -> None:
    paths = sorted((SRC / "hookscope").rglob("*.py"))
    found = [hit for path in paths for hit in imports_through_a_package(path, path.read_text(encoding="utf-8"))]
    assert found == [], "import these from the private module that defines them"
    fake = SRC / "hookscope" / "doctor" / "_fake.py"  # the check can fail:
    source = (
        "from ..results import WatchResults\nfrom ..results._results import WatchResults\nfrom ..hooks import HookInfo"
    )
    assert imports_through_a_package(fake, source) == ["_fake.py:1 WatchResults"]
    monitors = SRC / "hookscope" / "monitors" / "__init__.py"  # a package's own `name as name` import is its alias
    assert imports_through_a_package(
        monitors, "from ._base import Monitor as Monitor\nfrom ..reducers import Reducer"
    ) == ["__init__.py:2 Reducer"]


def test_the_reference_renders_every_public_name_once() -> None:
    shown = [item for target, members in directives() for item in rendered(target, members)]
    times = Counter(id(value) for _, value in shown)
    twice = sorted(where for where, value in shown if times[id(value)] > 1)
    assert not twice, f"rendered more than once: {twice}"
    pages = {target for target, _ in directives()} & {"hookscope", *MODULES, *subpackages()}
    exported = [(f"{ns}.{name}", getattr(importlib.import_module(ns), name)) for ns in pages for name in exports(ns)]
    nowhere = [name for name, value in exported if is_documentable(value) and not times[id(value)]]
    assert not nowhere, f"exported but rendered nowhere: {nowhere}"
    assert {"hookscope", *MODULES, *subpackages()} - {*INTERNAL, *pages} == set(), "a public package has no page"
    assert times[id(hookscope.watch)] == times[id(hookscope.OutputMonitor)] == 1
    again = [*shown, *rendered("hookscope.monitors", ["OutputMonitor"])]  # the check can fail
    assert Counter(id(value) for _, value in again)[id(hookscope.OutputMonitor)] == 2


def test_each_subpackage_page_links_the_top_level_names_it_holds() -> None:
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        linked = set(re.findall(r"\]\[hookscope\.(?:(?:summary|watch)\.)?(\w+)\]", text))
        for target in re.findall(r"^::: (hookscope\.\w+)$", text, flags=re.M):
            missing = set(held_by(target)) - linked
            assert not missing, f"{page.name} does not link the top-level names {target} holds: {sorted(missing)}"


def test_the_documentation_check_can_fail() -> None:
    """Names the documentation never shows as code, or only as another object's attribute, are not documented."""
    assert documentation().count("\n") > 1000  # the pages were read
    assert is_documented("hookscope.steer", "steering_vector") and is_documented("hookscope.hooks", "Hooks")
    assert not is_documented("hookscope.stats", "describe_segments")  # an engine function no page shows
    assert not is_documented("hookscope.hooks", "REGISTRY")  # named in a docstring, never in a page
    assert not is_documented("hookscope.report", "neutralize")
