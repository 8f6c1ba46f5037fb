"""`hookscope._torch` is the only module that touches a private PyTorch API (issue 23, item 4).

The private names are torch's own, read from torch here (not from hookscope): every `_name` (not dunder) that the
torch objects hookscope handles carry (modules, tensors, parameters, optimizers, the loss scaler, hook handles, the
autograd engine, torch's module-hook globals), plus the attributes torch's wrappers keep their module in. A module
other than `_torch.py` fails this test when it

- imports or names `torch._...` or another private segment under `torch` / `nn` (`nn.modules.conv._ConvNd`),
- reads or writes one of those private names as an attribute of anything but its own `self`/`cls`,
- spells one of them as a string (to read it later with `getattr`, as `list_hooks` did with torch's hook dicts).
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.modules.module as module_globals

SOURCE = Path(__file__).resolve().parents[2] / "src" / "hookscope"
OWNER = SOURCE / "_torch.py"
TORCH_ROOTS = {"torch", "nn", "F", "module_globals", "dist", "flop_counter", "parametrize"}
"""Names hookscope binds to torch modules (`import torch.nn as nn` ...): a private segment below them is torch's."""
WRAPPER_ATTRIBUTES = {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
ALLOWED_STRINGS = {
    "hookscope/summary/_flops.py": "names of aten operators (`_softmax` ...), looked up and checked by _torch.aten_ops",
}
"""Modules that may spell a private torch name as a string, and why. Nothing else is allowed: every other private
reliance goes through `_torch.py`."""


def _private(names: list[str]) -> set[str]:
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def torch_private_names() -> set[str]:
    """The private names of the torch objects hookscope handles, as torch defines them."""
    module = nn.Module()
    leaf = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([leaf], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    handle = module.register_forward_hook(lambda *args: None)
    engine = torch.autograd.Variable._execution_engine
    objects = [module, vars(module), leaf, torch.Tensor, nn.Parameter, optimizer, scaler, handle, engine]
    objects += [torch, torch.autograd.Variable, module_globals, nn.modules.lazy.LazyModuleMixin]
    names = set(WRAPPER_ATTRIBUTES)
    for thing in objects:
        names |= _private(list(thing) if isinstance(thing, dict) else dir(thing))
    return names


def _chain(node: ast.AST) -> list[str]:
    """`a.b.c` -> ["a", "b", "c"]; [] when the chain does not start at a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else []


def violations(path: Path, private: set[str], root: Path = SOURCE) -> list[str]:
    """Every place in `path` (under the package `root`) that touches a private torch API, as `file:line: what`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(root.parent).as_posix()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("torch") and any(p.startswith("_") for p in node.module.split(".")):
                found.append((node.lineno, f"from {node.module} import"))
            found += [
                (node.lineno, f"imports {a.name}")
                for a in node.names
                if node.module.startswith("torch") and a.name in private
            ]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, f"import {a.name}") for a in node.names if "._" in a.name and a.name.startswith("torch")
            ]
        elif isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in TORCH_ROOTS and node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append((node.lineno, ".".join(chain)))
            elif node.attr in private and not (chain[:1] and chain[0] in {"self", "cls"} and len(chain) == 2):
                found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Constant) and node.value in private and where not in ALLOWED_STRINGS:
            found.append((node.lineno, repr(node.value)))
    return [f"{where}:{line}: {what}" for line, what in sorted(found)]


def test_only_the_torch_module_touches_private_torch_apis() -> None:
    private = torch_private_names()
    files = sorted(p for p in SOURCE.rglob("*.py") if p != OWNER)
    assert len(files) > 100  # the whole package is read
    found = [v for path in files for v in violations(path, private)]
    assert found == [], "private PyTorch APIs outside hookscope/_torch.py (go through it):\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_private_use(tmp_path: Path) -> None:
    """The checker itself: each way of touching a private torch API is found (a scan that finds nothing proves
    nothing), and hookscope's own private attributes are not."""
    code = (
        "import torch\nimport torch._dynamo\nfrom torch._C import _nn\nimport torch.nn as nn\n"
        "def f(module, scaler, t, self):\n"
        "    torch._C._current_graph_task_id()\n"
        "    module._forward_hooks\n"
        "    getattr(scaler, '_scale', None)\n"
        "    t._is_view()\n"
        "    nn.modules.conv._ConvNd\n"
        "    module._orig_mod\n"
        "    self._table, self._forward_hooks, module.weight\n"
    )
    target = tmp_path / "hookscope" / "_sample.py"
    target.parent.mkdir()
    target.write_text(code)
    found = violations(target, torch_private_names(), root=tmp_path / "hookscope")
    assert [v.split(": ", 1)[1] for v in found] == [
        "import torch._dynamo",
        "from torch._C import",
        "torch._C",
        "torch._C._current_graph_task_id",
        "._forward_hooks",
        "'_scale'",
        "._is_view",
        "nn.modules.conv._ConvNd",
        "._orig_mod",
    ]
