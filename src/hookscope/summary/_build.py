"""Build the rows and totals of a `ModelSummary` from the module tree and one recorded forward (or none)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import is_lazy

from .._torch import children as registered_children
from ..hooks import HookInfo
from ..hooks._listing import list_hooks
from ..hooks._select import unwrap
from ._collect import CallRecord, ForwardRun, has_forward
from ._columns import TableView
from ._memory import TrainingMemory
from ._params import count_bytes, count_params, effective_counts, groups, kernel_size, own_params
from ._shapes import describe, describe_call, tensor_bytes
from ._table import LayerRow, ModelSummary, Trainable

__all__ = ["BuildOptions", "Node", "build_summary", "hook_labels", "trainable_of", "walk"]


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
        children = [(f"{path}.{name}" if path else name, c, depth + 1) for name, c in registered_children(module)]
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
    for node in nodes:  # torch's own lazy-initialization hook is no hook of the user's
        labels = raw.get(node.path, [])
        for _ in range(_lazy_init_hooks(node.module)):
            if "forward_pre[user]" in labels:
                labels.remove("forward_pre[user]")
    return {path: [f"{k} x{n}" if n > 1 else k for k, n in Counter(labels).items()] for path, labels in raw.items()}


def _lazy_init_hooks(module: nn.Module) -> int:
    if not isinstance(module, LazyModuleMixin):
        return 0
    return int(module.has_uninitialized_params())  # its one initializing pre-hook is there until it initializes


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


def is_scripted(module: nn.Module) -> bool:
    """Whether `module` is a TorchScript (scripted or traced) module."""
    return isinstance(module, torch.jit.ScriptModule)


def type_name(module: nn.Module) -> str:
    """The class name of `module`; for a TorchScript module, that of the module it was made from."""
    return (
        str(getattr(module, "original_name", type(module).__name__)) if is_scripted(module) else type(module).__name__
    )


@dataclass
class _Tree:
    """What rows need to know about the whole model: parameter owners, effective counts, calls, scripts."""

    owners: dict[int, list[str]]
    effective: dict[int, int]
    first_calls: dict[int, int]
    in_script: set[str] = field(default_factory=set)


def _in_script_paths(nodes: list[Node]) -> set[str]:
    """Paths of the scripted modules that run inside another scripted module."""
    scripted = {node.path for node in nodes if is_scripted(node.module)}
    return {path for path in scripted if path and _module_of(path) in scripted}


def _row(node: Node, calls: list[CallRecord], hooks: list[str], tree: _Tree, mode: str) -> LayerRow:
    module = node.module
    alias = node.same_as is not None
    calls = [] if alias else calls
    holders = {_module_of(name) for q in module.parameters(recurse=False) for name in tree.owners.get(id(q), ())}
    parameters = list(module.parameters())
    return LayerRow(
        path=node.path,
        type=type_name(module),
        depth=node.depth,
        calls=len(calls),
        input_shape=calls[0].input_shape if calls else None,
        output_shape=calls[0].output_shape if calls else None,
        params=count_params(parameters),
        own_params=count_params(module.parameters(recurse=False)),
        trainable=trainable_of(module),
        flops=sum(c.flops for c in calls),
        self_flops=sum(c.self_flops for c in calls),
        mode=mode,
        hooks=() if alias else tuple(hooks),
        shares_with=() if alias else tuple(sorted(holders - {node.path})),
        same_as=node.same_as,
        param_bytes=count_bytes(parameters),
        buffer_bytes=count_bytes(module.buffers()),
        output_bytes=sum(c.output_bytes for c in calls),
        is_leaf=not any(True for _ in module.children()),
        has_forward=has_forward(module),
        kernel_size=kernel_size(module),
        groups=groups(module),
        parameters=own_params(module),
        effective_params=sum(tree.effective.get(id(p), 0) for p in parameters),
        is_lazy=any(is_lazy(p) for p in parameters),
        is_scripted=is_scripted(module),
        in_script=node.path in tree.in_script,
        first_call=None if alias else tree.first_calls.get(id(module)),
    )


@dataclass(frozen=True)
class BuildOptions:
    """How the summary was asked for and what happened around its run."""

    run_mode: str
    depth: int | None
    no_run_reason: str | None = None
    batch_dim: int | None = None
    memory: TrainingMemory | None = None
    view: TableView = field(default_factory=TableView)


def _quoted(paths: list[str], model: str, limit: int = 3) -> str:
    names = [repr(path) if path else f"{model} (root)" for path in paths]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _notes(model: str, options: BuildOptions, scripted: list[str], lazy: list[str]) -> list[str]:
    notes = []
    if options.no_run_reason is not None:
        notes.append(f"No forward run: {options.no_run_reason}; the shape and FLOPs columns are empty")
    if scripted:
        notes.append(
            f"TorchScript modules ({_quoted(scripted, model)}) run without Python hooks: the shapes and FLOPs of "
            "the modules inside them are not known (their own calls are seen from outside)"
        )
    if lazy:
        notes.append(
            f"Uninitialized lazy parameters in {_quoted(lazy, model)}: not counted in Params (run the model once "
            "to initialize them)"
        )
    if options.batch_dim is not None:
        notes.append(f"Inputs built with a batch of 1 at dim {options.batch_dim}: shapes, FLOPs and sizes per sample")
    return notes


def build_summary(
    model: nn.Module,
    nodes: list[Node],
    hooks: dict[str, list[str]],
    modes: dict[int, bool],
    run: ForwardRun | None,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    options: BuildOptions,
) -> ModelSummary:
    """Assemble the `ModelSummary` of `model` from its tree, its hooks and modes before the run, and the run."""
    calls = [] if run is None else run.calls
    by_module: dict[int, list[CallRecord]] = {}
    for call in calls:
        by_module.setdefault(call.module_id, []).append(call)
    first_calls: dict[int, int] = {}
    for index, call in enumerate(calls):
        first_calls.setdefault(call.module_id, index)
    unique = [n for n in nodes if n.same_as is None]
    tree = _Tree(_param_owners(nodes), effective_counts(n.module for n in unique), first_calls, _in_script_paths(nodes))
    rows = _with_uncalled_flops(
        [
            _row(n, by_module.get(id(n.module), []), hooks.get(n.path, []), tree, _mode(modes[id(n.module)]))
            for n in nodes
        ]
    )
    parameters = list(model.parameters())
    shared = {id(p) for p in parameters if len(tree.owners.get(id(p), ())) > 1}
    scripted = [n.path for n in unique if is_scripted(n.module) and n.path not in tree.in_script]
    lazy = [n.path for n in unique if any(is_lazy(p) for p in n.module.parameters(recurse=False))]
    has_run = run is not None
    return ModelSummary(
        model=type_name(model),
        rows=rows,
        input_shape=describe_call(*inputs) if has_run else None,
        output_shape=describe(run.output) if run is not None else None,
        total_params=count_params(parameters),
        trainable_params=count_params(p for p in parameters if p.requires_grad),
        shared_params=count_params(p for p in parameters if id(p) in shared),
        shared_names=tuple(tuple(tree.owners[id(p)]) for p in parameters if id(p) in shared),
        param_bytes=count_bytes(parameters),
        buffer_bytes=count_bytes(model.buffers()),
        input_bytes=tensor_bytes(inputs) if has_run else 0,
        activation_bytes=sum(row.output_bytes for row in rows if row.is_leaf),
        total_flops=run.total_flops if run is not None else 0,
        global_hooks=tuple(hooks.get("<global>", [])),
        run_mode=options.run_mode,
        depth=options.depth,
        has_run=has_run,
        notes=tuple(_notes(type_name(model), options, scripted, lazy)),
        effective_params=sum(tree.effective.get(id(p), 0) for p in parameters),
        uninitialized=tuple(lazy),
        scripted=tuple(scripted),
        batch_dim=options.batch_dim,
        memory=options.memory,
        view=options.view,
    )


def _mode(training: bool) -> str:
    return "train" if training else "eval"
