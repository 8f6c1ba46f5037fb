"""Every public entry point, generated from the signatures: each argument given a value of the wrong type and a
wrong value must raise `TypeError` / `ValueError` naming the argument and the value, before anything happens.

The entry points are the functions and classes in `hookscope.__all__` and in the `__all__` of the subpackages
listed in `PACKAGES`, so a new one is checked as soon as it is exported; `EXCLUDED` says, for each exception, why.
Wrong types: one object of no type hookscope accepts. Wrong values: by annotation (`-1` for an int, NaN for a
float, a negative timeout, an unknown name for a str), with the values some arguments need instead in `WRONG`
and, in `FREE`, the arguments for which every value of the right type is valid (with the reason).
"""

from __future__ import annotations

import collections.abc as abc
import datetime
import importlib
import inspect
import math
import re
import types
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import hookscope
import hookscope.steer
from hookscope._types import _Lenient
from hookscope.reducers import StatsReducer

PACKAGES = (
    "hooks", "monitors", "reducers", "weights", "callbacks", "watch", "report", "plot", "distributed", "steer",
)  # fmt: skip
"""Subpackages whose whole `__all__` is checked (doctor and summary: their entry points in hookscope.__all__ and
in `hookscope.ELSEWHERE`, the names that left the top level for their subpackage)."""

EXCLUDED: dict[str, str] = {
    **dict.fromkeys(
        ("WatchResults", "Finding", "HookInfo", "HookHandle", "ModelSummary"),
        "a record hookscope builds and hands out (WatchResults is checked in full by its schema on save and load)",
    ),
    **dict.fromkeys(("ConstraintHandle", "HandleGroup", "HookData"), "built by hookscope, not by users"),
    **dict.fromkeys(("Reducer", "Monitor", "Callback", "Intervention"), "an abstract base: its subclasses are checked"),
    **dict.fromkeys(
        ("PatchResult", "Recording", "Steering"), "a result or handle steer builds and hands out (not built by users)"
    ),
}


class Garbage:
    """A value of no type any hookscope entry point accepts."""

    def __repr__(self) -> str:
        return "<garbage>"


GARBAGE = Garbage()
BAD_NAME = "\x00no-such-name"


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


@cache
def _things(root: str) -> dict[str, Any]:
    """Valid objects to build calls from (one set per test session, in a temporary folder)."""
    folder = Path(root)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    results = hookscope.WatchResults(steps=torch.arange(2), layers={"0": "Linear"})
    results.activations["0"] = {"mean": torch.zeros(2), "std": torch.ones(2)}
    results.histograms["0"] = torch.ones(2, 4)
    results.hist_edges["0"] = torch.linspace(-1, 1, 5)
    results.unit_activity["0"] = torch.ones(4)
    results.losses = torch.ones(2)
    report = folder / "report"
    hookscope.report.write_report(report, results)
    (folder / "a-file").write_text("x")
    data = hookscope.add_weight_update_monitor_hook(optimizer)
    return {
        "state_file": hookscope.save_state(folder / "saved.safetensors", {"a": 1}),
        "folder": folder,
        "model": model,
        "optimizer": optimizer,
        "results": results,
        "report": report,
        "update_data": data,
        "change_data": hookscope.add_weight_change_monitor_hook(model),
        "hook": lambda *args: None,
        "parameter": model[0].weight,
        "tensor": torch.ones(3, requires_grad=True),
        "stats": hookscope.ActivationStats(),
    }


def recipe(name: str, t: dict[str, Any]) -> dict[str, Any]:
    """Valid arguments for the required parameters of entry point `name`."""
    model, hook, optimizer, results = t["model"], t["hook"], t["optimizer"], t["results"]
    monitor_args = {"reducer": StatsReducer(), "module": model[0]}
    module_like = {"module": model, "model": model, "m": model, "ms": [model[0]], "modules": [model[0]]}
    table: dict[str, dict[str, Any]] = {
        "DifferenceMonitor": {**monitor_args, "attr": "weight"},
        "StateMonitor": {**monitor_args, "attr": "weight"},
        "ParameterGradMonitor": {**monitor_args, "attr": "weight"},
        "EMAReducer": {"alpha": 0.5},
        "HistogramReducer": {"bins": 4},
        "QuantileReducer": {"q": 0.5},
        "ReservoirReducer": {"capacity": 4},
        "Hook": {"m": model[0], "hook_func": hook},
        "HookErrors": {"owner": "a test"},
        "Hooks": {"ms": [model[0]], "hook_func": hook},
        "LoopDriver": {"callbacks": [hookscope.Callback()], "model": model},
        "MonitorPool": {"constructor": hookscope.OutputMonitor.partialconstructor(StatsReducer()), "model": model},
        "add_weight_update_monitor_hook": {"optimizer": optimizer},
        "analyze_weight_updates": {"update_history": {"w": [0.1, 0.2]}},
        "combine_results": {"parts": [results]},
        "compute_weight_changes": {"model": model, "hook_data": t["change_data"]},
        "diagnose": {"results": results},
        "format_findings": {"findings": []},
        "load_state": {"path": t["state_file"]},
        "summary": {"model": model, "input_size": (2, 3)},
        "Watch": {"model": model},
        "merge_results": {"results": results},
        "normalize_path": {"path": "module.0"},
        "print_weight_summary": {"weight_changes": {"0": 0.1}, "weight_stats": {}},
        "format_weight_summary": {"weight_changes": {"0": 0.1}, "weight_stats": {}},
        "register_constraint": {"model": model, "constraint": hookscope.weights.MaxNorm(1.0)},
        "register_global_module_hook": {"kind": "forward", "hook": hook},
        "register_global_optimizer_hook": {"kind": "step_post", "hook": hook},
        "register_module_hook": {"module": model[0], "kind": "forward", "hook": hook},
        "register_optimizer_hook": {"optimizer": optimizer, "kind": "step_post", "hook": hook},
        "register_output_grad_hook": {"module": model[0], "hook": hook},
        "register_post_accumulate_grad_hook": {"parameter": t["parameter"], "hook": hook},
        "register_tensor_hook": {"tensor": t["tensor"], "hook": hook},
        "restore_optimizer_step": {"optimizer": optimizer, "hook_data": t["update_data"]},
        "save_state": {"path": t["folder"] / "state.safetensors", "source": {"a": 1}},
        "path_of": {"model": model, "module": model[0]},
        "init_weights_": {"model": model, "init": lambda w: None},
        "load_state_dict_remapped": {"model": model, "state_dict": model.state_dict()},
        "remap_state_dict": {"state_dict": model.state_dict(), "model": model},
        "register_weight_decay": {"model": model, "weight_decay": 0.1, "lr": 0.1},
        "scale_weights_": {"model": model, "factor": 1.0},
        "set_weights_": {"model": model, "weights": {}},
        "weight_distance": {"model": model, "reference": _model()},
        "weight_statistics": {"weight": torch.ones(2, 2)},
        "combine_activation_stats": {"parts": [t["stats"]]},
        "merge_activation_stats": {"stats": t["stats"]},
        "CSVSink": {"path": t["folder"] / "s.csv"},
        "JSONLSink": {"path": t["folder"] / "s.jsonl"},
        "default_selector": {"path": "0", "module": model[0]},
        "identical_units": {"module": model[0]},
        "render_report": {"out_dir": t["report"]},
        "remove_report": {"out_dir": t["folder"] / "removed"},
        "write_index": {"out_dir": t["folder"] / "index", "pages": [], "meta": {}},
        "write_report": {"out_dir": t["folder"] / "out", "results": results},
        "save_report_data": {"out_dir": t["folder"] / "data", "results": results},
        "safe_filename": {"name": "model"},
        "neutralize": {"value": "x"},
        "color_dim": {"hist": torch.ones(2, 4)},
        "layer_stats": {"means": [0.0], "stds": [1.0], "near_zeros": [0.0]},
        "params_of": {"results": results, "path": "0"},
        "plot_histogram": {"results": results, "layer": "0"},
        "plot_unit_activity": {"results": results, "layer": "0"},
        "plot_layer": {"results": results, "path": "0"},
        "plot_weight_histograms": {"histograms": {}},
        "plot_weights": {"weights": model},
        "weight_histograms": {"weights": model},
        "all_gather": {"tensor": torch.ones(2)},
        "all_reduce": {"tensor": torch.ones(2)},
        "gather_objects": {"value": 1},
        "is_sharded": {"tensor": torch.ones(2)},
        "merge_records": {"records": torch.zeros(2, 9, dtype=torch.float64)},
        "merge_stats_reducer": {"reducer": StatsReducer()},
        "norm_of_shards": {"local_square_sum": torch.ones(())},
        "union_keys": {"keys": ["a"]},
        **_steer_recipes(model, t),
    }
    if name in table:
        return table[name]
    if name.endswith("Monitor") and name != "UpdateRatioMonitor":
        return {"reducer": StatsReducer()}
    required = [p for p in _parameters(name) if p.default is p.empty]
    return {p.name: module_like[p.name] for p in required if p.name in module_like} | (
        {"results": results} if any(p.name == "results" for p in required) else {}
    )


def _steer_recipes(model: nn.Module, t: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tokens = torch.randn(2, 5, 3)  # [batch, seq, features] for the MLP: sites with a sequence dimension
    patching = {"model": model, "clean": tokens, "corrupted": tokens + 1, "metric": lambda out: out.sum()}
    return {
        "Add": {"vector": torch.ones(4)},
        "Replace": {"value": torch.ones(4)},
        "Mean": {"mean": torch.ones(4)},
        "Project": {"direction": torch.ones(4)},
        "Scale": {"factor": 2.0},
        "record": {"model": model, "select": "0"},
        "intervene": {"model": model, "interventions": {"0": hookscope.steer.Zero()}},
        "patch": {**patching, "select": "0"},
        "attribution_patch": {**patching, "select": "0"},
        "steering_vector": {"model": model, "positive": tokens, "negative": tokens + 1, "select": "0"},
        "save": {"path": t["folder"] / "spec.safetensors", "spec": {"0": hookscope.steer.Zero()}},
        "load": {"path": hookscope.steer.save(t["folder"] / "saved-spec.safetensors", {"0": hookscope.steer.Zero()})},
    }


# ---- wrong values ---------------------------------------------------------------------------------------------
def wrong_values(name: str, t: dict[str, Any]) -> dict[str, Any]:
    """Values of the right type that are wrong for these arguments (the default by annotation does not fit)."""
    folder = t["folder"]
    file, directory = folder / "a-file", folder
    return {
        "diagnose.checks": [BAD_NAME],
        "summary.batch_dim": 9,  # the example input has 2 dims
        "register_constraint.model": nn.LSTM(3, 4),  # no layer with a `weight` to constrain
        "watch.select": nn.Conv2d,  # matches nothing in an MLP
        "Watch.select": nn.Conv2d,
        "select_modules.select": nn.Conv2d,
        "MonitorPool.select": nn.Conv2d,
        "register_module_hook.hook": lambda module: None,  # a forward hook takes (module, args, output)
        "register_global_module_hook.hook": lambda module: None,
        "register_optimizer_hook.hook": lambda: None,
        "register_global_optimizer_hook.hook": lambda: None,
        "register_output_grad_hook.hook": lambda: None,
        "register_tensor_hook.hook": lambda: None,
        "register_post_accumulate_grad_hook.hook": lambda: None,
        "Hook.hook_func": lambda: None,
        "Hooks.hook_func": lambda: None,
        "MonitorPool.constructor": lambda: None,
        "init_weights_.init": lambda: None,
        "register_post_accumulate_grad_hook.parameter": torch.ones(2),  # does not require grad
        "register_tensor_hook.tensor": torch.ones(2),
        "restore_optimizer_step.hook_data": {},
        "compute_weight_changes.hook_data": {},
        "save_state.path": directory,
        "load_state.path": directory,
        "CSVSink.path": directory,
        "TensorBoardSink.log_dir": file,
        "JSONLSink.path": directory,
        "render_report.out_dir": file,
        "remove_report.out_dir": file,
        "write_report.out_dir": file,
        "save_report_data.out_dir": file,
        "write_index.out_dir": file,
        "set_weights_.weights": {BAD_NAME: torch.ones(1)},
        "remap_state_dict.state_dict": {1: 2},
        "load_state_dict_remapped.state_dict": {BAD_NAME: torch.ones(1)},
        "weight_distance.reference": nn.Linear(9, 9),
        "LoopDriver.callbacks": [],
        "hook_outputs.modules": [],
        "Hooks.ms": [],
        "combine_results.parts": [],
        "combine_activation_stats.parts": [],
        "color_dim.hist": torch.ones(3),
        "merge_records.records": torch.zeros(2, 3),  # not moments records (9 columns)
        "plot_weight_histograms.histograms": {"x": (torch.ones(2), torch.ones(2))},
        "QuantileReducer.q": [],
        "layer_stats.means": [],
        "layer_stats.stds": [1.0, 2.0],
        "layer_stats.near_zeros": [1.0, 2.0],
        "intervene.interventions": {},
        "save.spec": {},
        "save.path": directory,
        "load.path": directory,
    }


REGISTRATIONS = (
    "register_module_hook",
    "register_global_module_hook",
    "register_optimizer_hook",
    "register_global_optimizer_hook",
    "register_output_grad_hook",
    "register_tensor_hook",
    "register_post_accumulate_grad_hook",
)
"""hookscope.hooks' registration functions (their owner, tags and errors arguments take any value of their type)."""

FREE: dict[str, str] = {
    # Every value of the right type is valid for these arguments; the reason is given.
    "normalize_path.path": "any dotted path can be normalized",
    "safe_filename.name": "any text becomes a file name",
    "safe_filename.default": "any text becomes a file name",
    "neutralize.value": "any value is neutralized",
    "layer_stats.title": "any title",
    "MaxNorm.dim": "a dim (negative ones count from the end) is checked against the weight it applies to",
    "UnitNorm.dim": "a dim (negative ones count from the end) is checked against the weight it applies to",
    "ReservoirReducer.seed": "every int seeds a generator",
    "QuantileReducer.seed": "every int seeds a generator",
    "DeadUnitDetector.unit_dim": "a dim (negative ones count from the end) is checked against the output",
    "Clamp.min": "any bound (None: none), checked against max",
    "LoopDriver.model": "any module can be driven",
    "save_state.source": "any state dict or object with state_dict() (checked as it is encoded)",
    "gather_objects.value": "any picklable object is gathered",
    "default_selector.path": "any path (the selector looks at the module)",
    "save_state.kind": "a tag of the caller's choosing (load_state refuses a file of another kind)",
    "Watch.sinks": "any sinks (an object that is not one is refused as a wrong type)",
    "watch.sinks": "any sinks (an object that is not one is refused as a wrong type)",
    "Watch.scaler": "any GradScaler (its state is read as it is)",
    "watch.scaler": "any GradScaler (its state is read as it is)",
    "diagnose.thresholds": "any Thresholds (checked when built)",
    "format_weight_summary.weight_stats": "any statistics are shown as they are",
    "print_weight_summary.weight_stats": "any statistics are shown as they are",
    "format_weight_summary.weight_changes": "any changes are shown as they are (NaN says the weight broke)",
    "print_weight_summary.weight_changes": "any changes are shown as they are (NaN says the weight broke)",
    "write_index.pages": "any (name, page) pairs are linked",
    "write_index.meta": "any metadata is shown, as text",
    "write_report.findings": "any findings are shown, as text",
    "save_report_data.findings": "any findings are saved, as text",
    "save_report_data.meta": "any metadata is saved, as text",
    "save_report_data.weights": "any module or named tensors are saved as histograms",
    "write_report.meta": "any metadata is shown, as text",
    "write_report.weights": "any module or named tensors are drawn",
    **{f"{name}.owner": "any object can own hooks" for name in (*REGISTRATIONS, "remove_hooks")},
    **{f"{name}.tags": "any text is a tag" for name in REGISTRATIONS},
    **{f"{name}.errors": "any HookErrors (None: a failure raises, as in PyTorch)" for name in REGISTRATIONS},
    "HookErrors.owner": "any text names the owner in the message",
    "HookErrors.counter": "any text says where the count is shown",
    **{
        f"{name}.path": "a label the hook is listed under"
        for name in (
            "register_module_hook",
            "register_output_grad_hook",
            "register_tensor_hook",
            "register_post_accumulate_grad_hook",
        )
    },
    "remove_hooks.tag": "a criterion that matches nothing removes nothing (the count says 0)",
    "remove_hooks.path": "a glob that matches nothing removes nothing (the count says 0)",
    "path_of.module": "a module outside the model has no path: the answer is None",
    **{
        f"{name}.ax": "a matplotlib Axes (matplotlib loads lazily; other objects fail inside matplotlib)"
        for name in (
            "color_dim",
            "plot_histogram",
            "plot_unit_activity",
        )
    },
    "analyze_weight_updates.update_history": "any records are summarized (NaN ones as NaN)",
    "weight_statistics.weight": "statistics of any tensor",
    "format_findings.findings": "any findings are formatted",
    "merge_activation_stats.stats": "any ActivationStats (every rank passes its own)",
    "plot_weights.weights": "any module or named tensors are drawn",
    "weight_histograms.weights": "any module or named tensors are binned",
    "register_constraint.constraint": "any Constraint (a subclass defines its own projection)",
    "union_keys.keys": "any keys (repeats are merged)",
    "rebin.counts": "counts of any shape: rows of bins (merge code of issue 14 defines the layouts)",
    "rebin.edges": "edges shared (1-D) or per row (2-D)",
    "rebin.target": "edges shared (1-D) or per row (2-D)",
    **{
        f"{name}.{argument}": "any model inputs (a tensor, a tuple of arguments, a dict of keyword arguments): the "
        "model checks them"
        for name, arguments in (
            ("patch", ("clean", "corrupted")),
            ("attribution_patch", ("clean", "corrupted")),
            ("steering_vector", ("positive", "negative")),
        )
        for argument in arguments
    },
    **{
        f"{name}.{argument}": "negative indices count from the end; they are checked against the value when applied"
        for name in ("Add", "Replace", "Mean", "Project", "Scale", "Zero")
        for argument in ("positions", "heads")
    },
    "steering_vector.position": "negative positions count from the end; one out of range is refused when read",
    "patch.metric": "any callable(output) -> scalar tensor (a wrong return is refused when called)",
    "attribution_patch.metric": "any callable(output) -> scalar tensor (a wrong return is refused when called)",
}
FREE_KINDS = (bool, nn.Module, torch.Tensor, torch.optim.Optimizer, hookscope.Reducer, hookscope.WatchResults)
"""Arguments of these types have no wrong value of their own (their wrong values above are exceptions)."""


# ---- discovery ------------------------------------------------------------------------------------------------
def entry_points() -> dict[str, Any]:
    found: dict[str, Any] = {}
    exported = [
        (name, getattr(namespace, name))
        for namespace in map(importlib.import_module, ["hookscope", *(f"hookscope.{name}" for name in PACKAGES)])
        for name in namespace.__all__
    ]
    moved = [(name, getattr(importlib.import_module(home), name)) for name, home in hookscope.ELSEWHERE.items()]
    for name, value in exported + moved:
        if callable(value) and not (isinstance(value, type) and issubclass(value, BaseException)):
            found.setdefault(name, value)
    return {name: value for name, value in sorted(found.items()) if name not in EXCLUDED}


def _parameters(name: str) -> list[inspect.Parameter]:
    signature = inspect.signature(entry_points()[name])
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p for p in signature.parameters.values() if p.kind not in kinds]


def annotation_of(name: str, parameter: inspect.Parameter) -> Any:
    target = entry_points()[name]
    function = inspect.unwrap(target.__init__ if isinstance(target, type) else target)
    text = parameter.annotation
    if not isinstance(text, str):
        return text
    return eval(text, function.__globals__, _Lenient(function.__globals__))  # the library's own annotation text


def _members(annotation: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return tuple(m for arg in typing.get_args(annotation) for m in _members(arg))
    return (annotation,)


def default_wrong_value(annotation: Any) -> Any:
    """A wrong value for an argument of this annotation, or `FREE_OF_TYPE` when every value of it fits."""
    members = [m for m in _members(annotation) if m is not type(None)]
    plain = {typing.get_origin(m) or m for m in members}
    if typing.Literal in plain:
        return BAD_NAME
    if plain & {float}:
        return math.nan
    if plain & {int}:
        return -1
    if plain & {datetime.timedelta}:
        return datetime.timedelta(seconds=-1)
    if plain & {tuple}:
        item = typing.get_args(next(m for m in members if typing.get_origin(m) is tuple))[0]
        return (0, -1) if item is int else (1.0, -1.0)
    if plain & {str}:
        return BAD_NAME
    if any(typing.get_origin(m) in (abc.Iterable, abc.Sequence) and typing.get_args(m) == (str,) for m in members):
        return [BAD_NAME]
    return FREE_OF_TYPE


FREE_OF_TYPE = object()


def cases() -> Iterator[tuple[str, str]]:
    for name in entry_points():
        for parameter in _parameters(name):
            yield name, parameter.name


ATTACHED = ("ActivationStats", "HookCallback")
"""Callbacks whose selector is resolved when they are attached to a model: the call attaches them."""


def _call(name: str, arguments: dict[str, Any]) -> Any:
    made = entry_points()[name](**arguments)
    if name in ATTACHED:
        made.attach(_model()).detach()
    return made


def _message_names(error: BaseException, argument: str, value: Any) -> bool:
    """Whether the message names the argument and shows the value (a container: an item of it, or its size)."""
    message = str(error)
    if re.search(rf"\b{re.escape(argument)}\b", message) is None:
        return False
    shown = {repr(value)[:30]}
    if isinstance(value, (list, tuple, dict)):
        shown |= {repr(item)[:30] for item in value} | {f"({len(value)},)", f"got {len(value)} "}
    if isinstance(value, torch.Tensor):
        shown.add(str(tuple(value.shape)))
    if isinstance(value, type):
        shown.add(value.__name__)
    if isinstance(value, Path):
        shown.add(repr(str(value))[:30])
    if isinstance(value, nn.Module):
        shown.add(type(value).__name__)
    return any(text in message for text in shown)


@pytest.fixture(scope="module")
def things(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _things(str(tmp_path_factory.mktemp("entry")))


@pytest.mark.parametrize("name", list(entry_points()))
def test_every_argument_refuses_a_wrong_type_and_a_wrong_value(name: str, things: dict[str, Any]) -> None:
    problems = []
    for parameter in _parameters(name):
        problems += _check_argument(name, parameter, things)
    assert not problems, "\n".join(problems)


def _check_argument(name: str, parameter: inspect.Parameter, things: dict[str, Any]) -> list[str]:
    key, annotation = f"{name}.{parameter.name}", annotation_of(name, parameter)
    problems = []
    base = recipe(name, things)
    if not _accepts_anything(annotation) or parameter.name in SELECTORS:
        problems += _expect(name, {**base, parameter.name: GARBAGE}, parameter.name, GARBAGE, TypeError)
    wrong = wrong_values(name, things).get(key, FREE_OF_TYPE)
    if wrong is FREE_OF_TYPE and key not in FREE:
        wrong = nn.Conv2d if parameter.name in SELECTORS else default_wrong_value(annotation)
    if wrong is FREE_OF_TYPE and key not in FREE and not _free_kind(annotation):
        problems.append(f"{key}: no wrong value known: add one to wrong_values() or a reason to FREE")
    if wrong is not FREE_OF_TYPE:
        problems += _expect(name, {**base, parameter.name: wrong}, parameter.name, wrong, (TypeError, ValueError))
    return problems


SELECTORS = ("select", "modules")
"""Selector arguments (annotated `Any`: a path, glob, module, type, predicate or list): refuse other objects.
`select` everywhere, but in fastai's vocabulary (`HookCallback(modules=)`, `ActivationStats(modules=)`)."""


def _accepts_anything(annotation: Any) -> bool:
    return annotation in (Any, object) or Any in _members(annotation) or object in _members(annotation)


def _free_kind(annotation: Any) -> bool:
    members = [m for m in _members(annotation) if m is not type(None)]
    return _accepts_anything(annotation) or all(
        (isinstance(m, type) and issubclass(m, FREE_KINDS)) or typing.get_origin(m) is abc.Callable for m in members
    )


def _expect(name: str, arguments: dict[str, Any], argument: str, value: Any, errors: Any) -> list[str]:
    try:
        _call(name, arguments)
    except errors as err:
        if _message_names(err, argument, value):
            return []
        return [f"{name}({argument}={value!r}): message does not name the argument and value: {err}"]
    except Exception as err:
        return [f"{name}({argument}={value!r}): {type(err).__name__} from inside: {err}"]
    return [f"{name}({argument}={value!r}) was accepted"]


def test_the_exclusions_are_few_and_still_exported() -> None:
    exported = {
        name
        for module in ["hookscope", *(f"hookscope.{p}" for p in PACKAGES)]
        for name in importlib.import_module(module).__all__
    } | set(hookscope.ELSEWHERE)
    assert set(EXCLUDED) <= exported and len(EXCLUDED) <= 18  # 14, and steer's base class, result and handles
    assert len(list(cases())) >= 300, len(list(cases()))
