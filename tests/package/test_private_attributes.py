"""No module of hookscope reads or writes another module's private attributes: state has one owner, and other
modules go through its public methods (STYLE.md, "State has one owner").

An access `obj._name` (or `getattr(obj, "_name")` / `setattr(obj, "_name", ...)`) outside `self`/`cls` is allowed
when a class of the same module defines `_name`; an access to a name that only another module of hookscope defines
is a finding. Private attributes of torch objects are `hookscope._torch`'s business (its own test).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[2] / "src" / "hookscope"


def _defined(tree: ast.AST) -> set[str]:
    """The private names a module's classes define: methods, class attributes and `self._x = ...` targets."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("_"):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else []
                if isinstance(item, ast.AnnAssign):
                    targets = [item.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def _accesses(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, name) of each private attribute read or written on something other than `self` or `cls`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                yield node.lineno, node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr"):
            named = node.args[1] if len(node.args) >= 2 else None
            name = named.value if isinstance(named, ast.Constant) and isinstance(named.value, str) else ""
            if name.startswith("_") and not name.startswith("__"):
                yield node.lineno, name


def _torch_names() -> set[str]:
    """Private names that torch's own objects carry (a module's `_modules`): `hookscope._torch`'s business."""
    objects = (nn.Module(), torch.zeros(1), torch.optim.SGD([nn.Parameter(torch.zeros(1))]))
    return {name for obj in objects for name in dir(obj) if name.startswith("_")}


def _findings() -> list[str]:
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(ROOT.rglob("*.py"))}
    owners: dict[str, set[Path]] = {}
    for path, tree in trees.items():
        for name in _defined(tree):
            owners.setdefault(name, set()).add(path)
    findings = []
    torch_names = _torch_names()
    for path, tree in trees.items():
        own = _defined(tree)
        for line, name in _accesses(tree):
            if name not in own and name in owners and name not in torch_names:
                where = ", ".join(str(p.relative_to(ROOT)) for p in sorted(owners[name]))
                findings.append(f"{path.relative_to(ROOT)}:{line}: {name} (defined in {where})")
    return findings


def test_no_module_touches_another_modules_private_attributes() -> None:
    findings = _findings()
    assert not findings, "private attributes of other modules:\n" + "\n".join(findings)


def test_the_scan_sees_a_foreign_private_access() -> None:
    owner = ast.parse("class A:\n    def __init__(self):\n        self._count = 0\n")
    user = ast.parse("def f(a):\n    a._count += 1\n    return getattr(a, '_count')\n")
    assert _defined(owner) == {"_count"} and _defined(user) == set()
    assert [name for _, name in _accesses(user)] == ["_count", "_count"]
