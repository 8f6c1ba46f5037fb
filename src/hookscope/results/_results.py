"""`WatchResults`: what `watch()` collected, as per-layer series over recorded steps; saved as safetensors + JSON.

Every series has one entry per recorded step (`steps`), `NaN` where the layer or parameter was not observed in
that step. This is the one format that the doctor, the plots and the report read.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._check import hint_for
from .._io import load_bundle, save_bundle
from .._schema import FLOAT, INT, Int, Json, ListOf, MapOf, Optional, Record, Rule, SchemaError, Str, Tensor, check
from .._text import display_name, quoted, shorten_middle, terminal_width, wrap
from ..stats._record import STATISTICS

__all__ = [
    "ACTIVATION_STATS",
    "ATTENTION_STATS",
    "FIGURES",
    "FIRST_NONFINITE",
    "GRAD_STATS",
    "OPTIMIZER_STATS",
    "RESIDUAL_STATS",
    "RESULTS_FILE",
    "SCHEMA",
    "WatchResults",
    "layer_figures",
    "results_file",
]

RESULTS_FILE = "results.safetensors"
"""The name of the results file in a report folder (`WatchResults.load(folder)` reads it)."""

ACTIVATION_STATS = STATISTICS
"""Per module output, per step (the engine's `hookscope.stats.STATISTICS`): mean, std (Bessel's correction, 0
for one value), root mean square, min, max, the fraction with |x| <= near_zero (`meta["near_zero"]`), the count
of non-finite values, the fraction within 1% of a bound (tanh/sigmoid-family modules only, else NaN), the count
of finite values observed (what statistics are merged by, across calls and across ranks) and the fraction of
values whose statistics were estimated from a sample (large outputs, unless `exact=True`). Every statistic but
the counts leaves non-finite values out."""

GRAD_STATS = ("norm", "nonfinite")
"""Per module output gradient and per parameter gradient, per step: the L2 norm of the finite values and the count
of non-finite values (in a large gradient that holds some, the norm and the count are estimated from a sample)."""

ATTENTION_STATS = ("max_logit", "entropy", "sink", "sampled")
"""Per attention module, per measured step and head (`WatchResults.attention`): the largest pre-softmax logit
(scaled as the attention scales it, masked keys left out), the entropy of each query's attention distribution
divided by the log of the number of keys it may attend to (0: one-hot, 1: uniform) averaged over queries and
batch, the mean attention share of the first key (`sink`), and the fraction of the queries left out of the
measurement (`sampled`: 0 when every query was measured; above 0 the max logit is a lower bound)."""

RESIDUAL_STATS = ("max", "channel", "token", "median")
"""Per repeated block's output (the residual stream), per step (`WatchResults.residual`): the largest magnitude,
its channel (last dim) and token (the dim before it), and the median magnitude of the whole hidden state
(estimated from a strided sample of at most 8192 values)."""

OPTIMIZER_STATS = ("grad_rms", "update_rms", "eps", "lr")
"""Per parameter, per step, against the optimizer (`WatchResults.optimizer`): the gradient's root mean square,
the update's root mean square divided by the learning rate (the unscaled update), the optimizer's epsilon for the
parameter (NaN for optimizers without one) and its learning rate in that step (as its param group held it; NaN
for a learning rate kept as a tensor on an accelerator, which is not read back). Results saved before `lr` was
recorded load without it."""

_KIND = "watch_results"
FIGURES = ("mean", "std", "grad norm", "nonfinite")
"""The per-layer figures `summary()` and the notebook table show, in order (`layer_figures`)."""
_MIN_NAME = 8  # the narrowest layer column
_FIGURE = 9  # the width of one figure: `.3g` of a float32 takes at most 9 characters (-1.23e-05)


@dataclass
class WatchResults:
    """Per-layer series collected by `watch()`; all tensors on the CPU.

    Attributes:
        steps: (S,) int64, the step number of each recorded step (counted from 0).
        layers: module path -> module type name, for every selected module, in model order.
        activations: module path -> stat name (`ACTIVATION_STATS`) -> (S,) float64.
        histograms: module path -> (S, bins) float64 counts of the finite output values, every step on the
            layer's one range: the widest its values needed (a symmetric power of two, widened and re-binned
            exactly as larger values came; nothing is clamped into an end bin), or the fixed `hist_range`.
        hist_edges: module path -> (bins + 1,) float64 bin edges of that range.
        hist_outside: module path -> (S, 2) float64 counts of the values below and above a fixed `hist_range`
            (empty for a range that follows the data: nothing falls outside it).
        output_grads: module path -> stat name (`GRAD_STATS`) -> (S,) float64, d loss / d output.
        param_grads: parameter name -> stat name (`GRAD_STATS`) -> (S,) float64, after accumulation (and after
            DDP's all-reduce when wrapped: `meta["grad_reduction"]` says which).
        update_ratios: parameter name -> (S,) float64, ||W_after - W_before|| / ||W_after|| per optimizer step.
        attention: attention module path (the innermost module running when the logits were formed) -> stat
            name (`ATTENTION_STATS`) -> (S, heads) float64, NaN on steps not measured.
        residual: repeated block path (a child of a `ModuleList`/`Sequential` of one class) -> stat name
            (`RESIDUAL_STATS`) -> (S,) float64.
        optimizer: parameter name -> stat name (`OPTIMIZER_STATS`) -> (S,) float64.
        losses: (S,) float64 when the loss was logged (`watch.log_loss`), else `None`; NaN in a step without a
            logged loss, where `loss_counts` is 0 (unknown, not non-finite).
        loss_counts: (S,) float64, how many losses were logged in each step (`None` with `losses`).
        logged_steps: (L,) int64, every step whose loss was logged, measured or not (a long run keeps an evenly
            thinned subset, always its first and latest), or `None` when no loss was logged.
        logged_losses: (L,) float64, the loss of each of `logged_steps` (the mean of the losses logged in it).
        unit_activity: module path -> (units,) float64, the fraction of observed values of each output unit
            (dim 1 of 4-D and 5-D outputs and of convolution/normalization layers, the last dim otherwise) that
            were > 0, over all recorded steps.
        identical_units: module path -> number of output units identical (within 1e-6) to another unit of the
            same layer, read from the weights when the results were taken.
        first_nonfinite: `{"forward": {"path", "step"} or None, "backward": {"path", "step"} or None}`: the first
            module (in execution order) whose output, or output gradient, became NaN/Inf; forward, a module called
            several times in a step is placed by its first call whose output was not finite.
        unobserved: module path -> why it was never observed (with advice).
        execution_order: module paths in the order their forward first completed (children before parents).
        dropped: reason -> number of observations not kept (`"sampling"`, `"capacity"`, `"eval"` ...).
        skipped_steps: the steps a `GradScaler` skipped (non-finite gradients: the optimizer did not step),
            recorded or not; only known when `watch(..., scaler=)` was given.
        meta: free-form run metadata (options, torch version, model class ...), JSON-able.
    """

    steps: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    layers: dict[str, str] = field(default_factory=dict)
    activations: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    histograms: dict[str, torch.Tensor] = field(default_factory=dict)
    hist_edges: dict[str, torch.Tensor] = field(default_factory=dict)
    hist_outside: dict[str, torch.Tensor] = field(default_factory=dict)
    output_grads: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    param_grads: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    update_ratios: dict[str, torch.Tensor] = field(default_factory=dict)
    attention: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    residual: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    optimizer: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    losses: torch.Tensor | None = None
    loss_counts: torch.Tensor | None = None
    logged_steps: torch.Tensor | None = None
    logged_losses: torch.Tensor | None = None
    unit_activity: dict[str, torch.Tensor] = field(default_factory=dict)
    identical_units: dict[str, int] = field(default_factory=dict)
    first_nonfinite: dict[str, dict[str, Any] | None] = field(
        default_factory=lambda: {"forward": None, "backward": None}
    )
    unobserved: dict[str, str] = field(default_factory=dict)
    execution_order: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    skipped_steps: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        """The number of recorded steps."""
        return int(self.steps.numel())

    def series(self) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
        """Every (S,) series by group (`activations`, `output_grads`, `param_grads`, `update_ratios`, `residual`,
        `optimizer`, `losses`); the per-head `attention` series are (S, heads) and not among them."""
        out: dict[str, dict[str, dict[str, torch.Tensor]]] = {
            "activations": self.activations,
            "output_grads": self.output_grads,
            "param_grads": self.param_grads,
            "update_ratios": {name: {"ratio": s} for name, s in self.update_ratios.items()},
            "residual": self.residual,
            "optimizer": self.optimizer,
        }
        if self.losses is not None:
            logged = {} if self.loss_counts is None else {"count": self.loss_counts}
            out["losses"] = {"loss": {"loss": self.losses, **logged}}
        return out

    def summary(self, max_layers: int = 20, width: int | None = None) -> str:
        """Return a short text table: per layer, the last recorded step's activation and gradient figures.

        Args:
            max_layers: show at most this many layers (the rest are counted).
            width: the most characters per line; layer paths and types are shortened in the middle to fit
                (`hookscope._text.shorten_path`, numbers kept whole). `None`: the terminal's width (100 without one).

        Example:
            >>> print(WatchResults().summary())
            WatchResults: 0 recorded steps, 0 layers
        """
        columns = terminal_width() if width is None else width
        if isinstance(columns, bool) or not isinstance(columns, int) or columns < 60:
            raise ValueError(f"width must be an int >= 60 or None (the terminal's width), got {width!r}")
        lines = [f"WatchResults: {self.num_steps} recorded steps, {len(self.layers)} layers"]
        if self.num_steps and self.layers:
            lines += self._layer_rows(list(self.layers)[:max_layers], columns)
            if len(self.layers) > max_layers:
                lines.append(f"... {len(self.layers) - max_layers} more layers")
        if self.losses is not None and self.losses.numel():
            lines.append(f"loss: first {float(self.losses[0]):.4g}, last {float(self.losses[-1]):.4g}")
        for direction, hit in (self.first_nonfinite or {}).items():
            if hit:
                where = quoted(hit["path"], columns // 2)
                lines.append(f"first non-finite ({direction}): {where} at step {hit['step']}")
        for path, reason in self.unobserved.items():
            lines += wrap(f"unobserved: {quoted(path, columns // 2)}: {reason}", columns, indent="    ")
        if self.skipped_steps:
            shown = ", ".join(map(str, self.skipped_steps[:10])) + (" ..." if len(self.skipped_steps) > 10 else "")
            lines.append(f"skipped by the loss scaler ({len(self.skipped_steps)}): steps {shown}")
        if self.dropped:
            lines.append(
                "not kept: " + ", ".join(f"{reason} {count}" for reason, count in sorted(self.dropped.items()))
            )
        return "\n".join(lines)

    def _layer_rows(self, paths: list[str], columns: int) -> list[str]:
        """The header and one row per layer of `summary`, `columns` wide."""
        figures = len(FIGURES) * (_FIGURE + 1)
        kind = max(min(max(len(self.layers[p]) for p in paths), 16, columns - figures - _MIN_NAME - 1), len("type"))
        name = columns - kind - 1 - figures
        rows = [f"{'layer':<{name}} {'type':<{kind}}" + "".join(f" {h:>{_FIGURE}}" for h in FIGURES)]
        for path in paths:
            cells = layer_figures(self, path)
            layer, kind_name = display_name(path, name), shorten_middle(self.layers[path], kind)
            rows.append(f"{layer:<{name}} {kind_name:<{kind}}" + "".join(f" {c:>{_FIGURE}.3g}" for c in cells))
        return rows

    def __repr__(self) -> str:
        from ._display import results_repr

        return results_repr(self)

    def _repr_html_(self) -> str:
        """The layers' table with small plots of their series, for notebooks (`IPython.display` calls it)."""
        from ._display import results_html

        return results_html(self)

    def measured_text(self) -> str:
        """Which steps were measured, in words a user can check against `steps` ("" when `meta` does not say).

        >>> measured = {"steps": 700, "budget": 0.03, "cost": 0.029, "recorded": 100}
        >>> WatchResults(meta={"measured": measured}).measured_text()
        'Measured 100 of 700 steps (1 step in 7) within a 3 % overhead budget; hookscope took 2.9 % of the step time.'
        """
        measured = self.meta.get("measured")
        if not isinstance(measured, dict) or not measured.get("steps"):
            return ""
        steps, recorded, cost = measured["steps"], measured.get("recorded", self.num_steps), measured.get("cost")
        share = f"; hookscope took {100 * cost:.2g} % of the step time" if isinstance(cost, float) else ""
        if measured.get("budget") is not None:
            rate = f" (1 step in {round(steps / recorded)})" if recorded else ""
            return (
                f"Measured {recorded:,} of {steps:,} steps{rate} within a {100 * measured['budget']:.3g} % overhead "
                f"budget{share}.{self._thinned_text(steps, 1)}"
            )
        every = measured.get("every", 1)
        which = "every step" if every == 1 else f"1 step in {every} (every={every})"
        return f"Measured {which}: {recorded:,} of {steps:,} steps{share}.{self._thinned_text(steps, every)}"

    def _thinned_text(self, steps: int, every: int) -> str:
        """What capacity thinning kept, in words ("" when nothing was thinned)."""
        stride = self.meta.get("stride", 1)
        if not isinstance(stride, int) or stride <= 1:
            return ""
        nth = stride * every
        suffix = "th" if 10 <= nth % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(nth % 10, "th")
        return (
            f" {steps:,} steps: every {nth}{suffix} step kept, and the last, to stay within the capacity of "
            f"{self.meta.get('capacity')} kept steps."
        )

    def loss_logged(self) -> torch.Tensor:
        """(S,) bool: the steps whose loss was logged; elsewhere the loss is unknown (NaN), not non-finite.

        Results saved before `loss_counts` existed count every step as logged. Without `losses`, none is."""
        if self.losses is None:
            return torch.zeros(self.steps.shape, dtype=torch.bool)
        if self.loss_counts is None:
            return torch.ones(self.losses.shape, dtype=torch.bool)
        return self.loss_counts > 0

    def loss_series(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(steps, losses)`: every logged step's loss when that holds more steps than the measured ones (a run
        under the overhead budget), else the measured steps' (`steps`, `losses`); `None` without a logged loss."""
        logged = self.logged_losses
        if self.logged_steps is not None and logged is not None:
            measured = 0 if self.losses is None else int(self.loss_logged().sum())
            if logged.numel() > measured:
                return self.logged_steps, logged.double()
        if self.losses is None:
            return None
        return self.steps, self.losses.double()

    def to_records(self) -> list[dict[str, Any]]:
        """Long-format rows `{step, group, name, stat, value}`, one per recorded value (NaN rows skipped)."""
        steps = self.steps.tolist()
        rows = []
        for group, names in self.series().items():
            for name, stats in names.items():
                for stat, values in stats.items():
                    for step, value in zip(steps, values.tolist(), strict=True):
                        if not math.isnan(value):
                            rows.append({"step": step, "group": group, "name": name, "stat": stat, "value": value})
        return rows

    def to_dataframe(self) -> Any:
        """`to_records()` as a pandas DataFrame.

        Raises:
            ImportError: pandas is not installed (`pip install pandas`).
        """
        try:
            import pandas as pd
        except ImportError as err:
            raise ImportError("to_dataframe needs pandas: pip install pandas") from err
        return pd.DataFrame.from_records(self.to_records(), columns=["step", "group", "name", "stat", "value"])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the results atomically to one safetensors file (tensors) with a JSON header (the rest).

        Raises:
            ValueError: the results do not fit the format `load` reads (the field is named), or `path` is a
                folder or a device.
        """
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        check(SCHEMA, fields, "results", at="results")
        tensors: dict[str, torch.Tensor] = {"steps": self.steps}
        for group, names in self.series().items():
            for name, stats in names.items():
                for stat, values in stats.items():
                    tensors[f"{group}/{name}/{stat}"] = values
        for module, stats in self.attention.items():
            tensors.update({f"attention/{module}/{stat}": values for stat, values in stats.items()})
        for group in _NAMED_TENSORS:
            tensors.update({f"{group}/{name}": t for name, t in getattr(self, group).items()})
        if self.logged_steps is not None and self.logged_losses is not None:
            tensors.update({"logged/steps": self.logged_steps, "logged/losses": self.logged_losses})
        document = {name: value for name, value in fields.items() if name not in _TENSOR_FIELDS}
        document["tensor_order"] = list(tensors)  # safetensors sorts its keys: keep the layers' model order
        return save_bundle(path, tensors, document, _KIND)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WatchResults:
        """Read results written by `save` (never unpickles), checked in full against `SCHEMA` first.

        `path` is the file, or a folder a report was written to (`hookscope.report.write_report`, `hookscope
        run`): the results file in it is read.

        Raises:
            FileNotFoundError: there is no such file, or the folder holds no results file.
            ValueError: the file is not hookscope watch results (see `hookscope._io.load_bundle`), or a field
                does not fit the format (the message names the file and the field); a folder of several
                reports (one per model) names the files to choose from.
        """
        source = results_file(Path(path))
        tensors, document = load_bundle(source, _KIND)
        return cls(**_decode(tensors, document, f"file {str(source)!r}"))


hint_for(WatchResults, "the results of watch(model).results(), or WatchResults.load(path)")


def layer_figures(results: WatchResults, path: str) -> list[float]:
    """The figures `summary()` shows for a layer (`FIGURES`): the last recorded step's activation mean and std,
    output-gradient norm and non-finite count (NaN where not recorded)."""
    act, grad = results.activations.get(path, {}), results.output_grads.get(path, {})
    return [_last(act.get("mean")), _last(act.get("std")), _last(grad.get("norm")), _last(act.get("nonfinite"))]


def results_file(path: Path) -> Path:
    """The results file `path` names: itself, or the `RESULTS_FILE` in the report folder `path`.

    Raises:
        FileNotFoundError: `path` is a folder without results.
        ValueError: `path` is a folder of several reports (one per model); their results files are listed.
    """
    if not path.is_dir():
        return path
    if (path / RESULTS_FILE).is_file():
        return path / RESULTS_FILE
    inside = sorted(str(p) for p in path.glob(f"*/{RESULTS_FILE}"))
    if len(inside) == 1:
        return Path(inside[0])
    if inside:
        raise ValueError(
            f"path {str(path)!r} holds the reports of {len(inside)} models: load one of "
            f"{', '.join(repr(p) for p in inside)}"
        )
    raise FileNotFoundError(
        f"path must be a results file or a report folder holding {RESULTS_FILE}, got the folder {str(path)!r} "
        "without one; save results with results.save(path) or write a report with hookscope.report.write_report"
    )


def _decode(tensors: dict[str, torch.Tensor], document: dict[str, Any], source: str) -> dict[str, Any]:
    """The file's tensors and JSON document as `WatchResults` fields, checked in full against `SCHEMA`."""
    check(_DOCUMENT, document, source, at="results")
    fields = {name: value for name, value in document.items() if name != "tensor_order"}
    fields.setdefault("skipped_steps", [])
    fields.update({name: {} for name in _TENSOR_FIELDS if name not in _SINGLE}, losses=None, loss_counts=None)
    fields.update(logged_steps=None, logged_losses=None)
    order = [key for key in document.get("tensor_order", []) if key in tensors]
    for key in order + sorted(key for key in tensors if key not in order):
        _place(fields, key, tensors[key], source)
    check(SCHEMA, fields, source, at="results")
    return fields


def _place(fields: dict[str, Any], key: str, tensor: torch.Tensor, source: str) -> None:
    """Put the tensor saved as `key` where `save` took it from (`group/name/stat`, `group/name` or `steps`)."""
    group, _, rest = key.partition("/")
    name, _, stat = rest.rpartition("/")
    if key == "steps" or (group == "losses" and rest == "loss/loss"):
        fields[group] = tensor
    elif group == "losses" and rest == "loss/count":
        fields["loss_counts"] = tensor
    elif group == "logged" and rest in ("steps", "losses"):
        fields[f"logged_{rest}"] = tensor
    elif group in _STAT_GROUPS and "/" in rest:
        fields[group].setdefault(name, {})[stat] = tensor
    elif group == "update_ratios" and "/" in rest and stat == "ratio":
        fields[group][name] = tensor
    elif group in _NAMED_TENSORS and "/" in key:
        fields[group][rest] = tensor
    else:
        known = ", ".join(
            [
                "steps",
                "losses/loss/loss",
                "losses/loss/count",
                "logged/steps",
                "logged/losses",
                *(f"{g}/..." for g in (*_STAT_GROUPS, *_NAMED_TENSORS)),
            ]
        )
        raise SchemaError(source, f"tensor {key!r}", f"is not a results tensor (known: {known})")


_SERIES = Tensor(FLOAT, shape=("steps",))
_HEADS = Tensor(FLOAT, shape=("steps", "heads of {key}"))
_HIT = Optional(Record(path=Str(), step=Int(min=0)))
FIRST_NONFINITE = Record(forward=_HIT, backward=_HIT)
"""The format of the first non-finite module and step, per direction (`WatchResults.first_nonfinite`)."""
SCHEMA = Record(
    steps=Tensor(INT, shape=("steps",)),
    layers=MapOf(Str(), name="layers"),
    activations=MapOf(MapOf(_SERIES, key=Str(ACTIVATION_STATS)), keys_in="layers"),
    hist_edges=MapOf(Tensor(FLOAT, shape=("bins of {key}+1",)), keys_in="layers", name="hist_edges"),
    histograms=MapOf(Tensor(FLOAT, shape=("steps", "bins of {key}")), keys_in="hist_edges"),
    hist_outside=MapOf(Tensor(FLOAT, shape=("steps", 2)), keys_in="hist_edges"),
    output_grads=MapOf(MapOf(_SERIES, key=Str(GRAD_STATS)), keys_in="layers"),
    param_grads=MapOf(MapOf(_SERIES, key=Str(GRAD_STATS))),
    update_ratios=MapOf(_SERIES),
    attention=MapOf(Record({stat: _HEADS for stat in ATTENTION_STATS[:3]}, optional={"sampled": _HEADS})),
    residual=MapOf(MapOf(_SERIES, key=Str(RESIDUAL_STATS))),
    optimizer=MapOf(MapOf(_SERIES, key=Str(OPTIMIZER_STATS))),
    losses=Optional(_SERIES),
    loss_counts=Optional(_SERIES),
    logged_steps=Optional(Tensor(INT, shape=("logged",))),
    logged_losses=Optional(Tensor(FLOAT, shape=("logged",))),
    unit_activity=MapOf(Tensor(FLOAT, shape=("*",)), keys_in="layers"),
    identical_units=MapOf(Int(min=0), keys_in="layers"),
    first_nonfinite=FIRST_NONFINITE,
    unobserved=MapOf(Str(), keys_in="layers"),
    execution_order=ListOf(Str()),
    dropped=MapOf(Int(min=0)),
    skipped_steps=ListOf(Int(min=0)),
    meta=MapOf(Json()),
    rules=[
        Rule(
            "logged_losses",
            lambda r: (r["logged_steps"] is None) == (r["logged_losses"] is None),
            "and logged_steps come together (both None, or one loss per logged step)",
        )
    ],
)
"""The format of `WatchResults` (its fields, as saved and loaded): one length `steps` for every series,
each layer's histogram one bin fewer than its edges, layer-keyed tables keyed by `layers`' paths."""

_STAT_GROUPS = ("activations", "output_grads", "param_grads", "attention", "residual", "optimizer")
_NAMED_TENSORS = ("histograms", "hist_edges", "hist_outside", "unit_activity")
_TENSOR_FIELDS = (
    "steps",
    *_STAT_GROUPS,
    "update_ratios",
    "losses",
    "loss_counts",
    "logged_steps",
    "logged_losses",
    *_NAMED_TENSORS,
)
_SINGLE = ("steps", "losses", "loss_counts", "logged_steps", "logged_losses")  # one tensor each, not a table
_DOCUMENT = Record(
    {name: Json() for name in SCHEMA.fields if name not in _TENSOR_FIELDS and name != "skipped_steps"},
    optional={"skipped_steps": Json(), "tensor_order": ListOf(Str())},  # files from before skipped_steps
)
"""The JSON part of a results file: every field that is not a tensor (their formats: `SCHEMA`)."""


def _last(values: torch.Tensor | None) -> float:
    return float(values[-1]) if values is not None and values.numel() else math.nan
