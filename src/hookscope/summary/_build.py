"""Build the rows and totals of a `ModelSummary` from the module tree and one recorded forward."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch.nn as nn

from ..hooks import HookInfo, list_hooks, unwrap
from ._collect import CallRecord, ForwardRun
from ._shapes import describe, describe_call, tensor_bytes
from ._table import LayerRow, ModelSummary, Trainable

__all__ = ["Node", "build_summary", "trainable_of", "walk"]


@dataclass(frozen=True)
class Node:
    """A module at a path of the tree; `same_as` is set when the module already appeared at another path."""

    path: str
    module: nn.Module
    depth: int
    same_as: str | None


def walk(model: nn.Module) -> list[Node]:
    """Return every path of the module tree in registration order, repeated modules marked, wrappers skipped."""
    nodes: list[Node] = []
    first: dict[int, str] = {}
    pending: list[tuple[str, nn.Module, int]] = [("", model, 0)]  # iterative: no self-referencing closure
    while pending:
        path, module, depth = pending.pop()
        module = unwrap(module)
        if id(module) in first:
            nodes.append(Node(path, module, depth, first[id(module)]))
            continue
        first[id(module)] = path
        nodes.append(Node(path, module, depth, None))
        children = [
            (f"{path}.{name}" if path else name, c, depth + 1) for name, c in module._modules.items() if c is not None
        ]
        pending += reversed(children)
    return nodes


def trainable_of(module: nn.Module) -> Trainable:
    """Return `True` if every parameter of `module` requires grad, `"Partial"` if some do, else `False`."""
    flags = {p.requires_grad for p in module.parameters()}
    if flags == {True}:
        return True
    return "Partial" if flags == {True, False} else False


def hook_labels(model: nn.Module, nodes: list[Node]) -> dict[str, list[str]]:
    """Map module paths (and `"<global>"`) to labels of the hooks attached there, `kind[owner]` with counts."""
    owner_of = {}
    for node in nodes:
        if node.same_as is None:
            for name, _ in node.module.named_parameters(recurse=False):
                owner_of[f"{node.path}.{name}" if node.path else name] = (node.path, f"{name}.")
    raw: dict[str, list[str]] = {}
    for info in list_hooks(model):
        path, prefix = owner_of.get(info.path, (info.path, ""))
        raw.setdefault(path, []).append(prefix + _label(info))
    return {path: [f"{k} x{n}" if n > 1 else k for k, n in Counter(labels).items()] for path, labels in raw.items()}


def _label(info: HookInfo) -> str:
    kind = info.kind.removeprefix("global_")
    return f"{kind}[{info.owner or 'hookscope'}]" if info.is_hookscope else f"{kind}[user]"


def _param_owners(nodes: list[Node]) -> dict[int, list[str]]:
    """Map each parameter to the qualified names it has in the modules that hold it directly."""
    owners: dict[int, list[str]] = {}
    for node in nodes:
        if node.same_as is None:
            for name, parameter in node.module.named_parameters(recurse=False):
                owners.setdefault(id(parameter), []).append(f"{node.path}.{name}" if node.path else name)
    return owners


def _module_of(qualified: str) -> str:
    return qualified.rpartition(".")[0]


def _with_uncalled_flops(rows: list[LayerRow]) -> tuple[LayerRow, ...]:
    """Give modules that never ran themselves (ModuleList, ModuleDict) the FLOPs of their children."""
    for index in range(len(rows) - 1, -1, -1):
        row = rows[index]
        if row.calls or row.same_as is not None:
            continue
        children = []
        for later in rows[index + 1 :]:
            if later.depth <= row.depth:
                break
            if later.depth == row.depth + 1:
                children.append(later.flops)
        rows[index] = replace(row, flops=sum(children))
    return tuple(rows)


def _bytes(tensors: Iterable[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _row(node: Node, calls: list[CallRecord], hooks: list[str], owners: dict[int, list[str]], mode: str) -> LayerRow:
    module = node.module
    alias = node.same_as is not None
    calls = [] if alias else calls
    holders = {_module_of(name) for q in module.parameters(recurse=False) for name in owners.get(id(q), ())}
    shares = sorted(holders - {node.path})
    return LayerRow(
        path=node.path,
        type=type(module).__name__,
        depth=node.depth,
        calls=len(calls),
        input_shape=calls[0].input_shape if calls else None,
        output_shape=calls[0].output_shape if calls else None,
        params=sum(p.numel() for p in module.parameters()),
        own_params=sum(p.numel() for p in module.parameters(recurse=False)),
        trainable=trainable_of(module),
        flops=sum(c.flops for c in calls),
        self_flops=sum(c.self_flops for c in calls),
        mode=mode,
        hooks=() if alias else tuple(hooks),
        shares_with=() if alias else tuple(shares),
        same_as=node.same_as,
        param_bytes=_bytes(module.parameters()),
        buffer_bytes=_bytes(module.buffers()),
        output_bytes=sum(c.output_bytes for c in calls),
        is_leaf=not any(True for _ in module.children()),
        has_forward=type(module).forward is not nn.Module.forward,
    )


def build_summary(
    model: nn.Module,
    nodes: list[Node],
    hooks: dict[str, list[str]],
    modes: dict[int, bool],
    run: ForwardRun,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    run_mode: str,
    depth: int | None,
) -> ModelSummary:
    """Assemble the `ModelSummary` of `model` from its tree, its hooks and modes before the run, and the run."""
    by_module: dict[int, list[CallRecord]] = {}
    for call in run.calls:
        by_module.setdefault(call.module_id, []).append(call)
    owners = _param_owners(nodes)
    rows = _with_uncalled_flops(
        [
            _row(n, by_module.get(id(n.module), []), hooks.get(n.path, []), owners, _mode(modes[id(n.module)]))
            for n in nodes
        ]
    )
    parameters = list(model.parameters())
    shared = {id(p) for p in parameters if len(owners.get(id(p), ())) > 1}
    shared_names = tuple(tuple(owners[id(p)]) for p in parameters if id(p) in shared)
    return ModelSummary(
        model=type(model).__name__,
        rows=rows,
        input_shape=describe_call(*inputs),
        output_shape=describe(run.output),
        total_params=sum(p.numel() for p in parameters),
        trainable_params=sum(p.numel() for p in parameters if p.requires_grad),
        shared_params=sum(p.numel() for p in parameters if id(p) in shared),
        shared_names=shared_names,
        param_bytes=_bytes(parameters),
        buffer_bytes=_bytes(model.buffers()),
        input_bytes=tensor_bytes(inputs),
        activation_bytes=sum(row.output_bytes for row in rows if row.is_leaf),
        total_flops=run.total_flops,
        global_hooks=tuple(hooks.get("<global>", [])),
        run_mode=run_mode,
        depth=depth,
    )


def _mode(training: bool) -> str:
    return "train" if training else "eval"
