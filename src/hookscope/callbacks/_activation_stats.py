"""`ActivationStats`: fastai's per-batch activation statistics, computed on the device without per-layer syncs."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn as nn

from .._check import FINITE, checked
from .._errors import HookscopeWarning
from .._schema import FLOAT, INT, Int, ListOf, Optional, Record, Rule, Str, Tensor, check
from ..hooks import Selector, tensor_leaves
from ._hook_callback import HookCallback, HookFunction
from ._moments import BATCH_BELOW, RecordLayout, RecordWriter

__all__ = ["STATE", "ActivationStats", "RecordsDroppedWarning"]

STATE = Record(
    paths=ListOf(Str(), length="modules"),
    dropped=Int(min=0),
    tensors=Record(
        counts=Tensor(INT, shape=("records", "modules")),
        optional={
            "moments": Tensor(FLOAT, shape=("records", "modules", 3)),  # mean, population variance, count <= nz
            "hists": Tensor(FLOAT, shape=("records", "modules", "bins")),
        },
        rules=[
            Rule("moments", lambda t: t["counts"].shape[0] == 0 or "moments" in t, "is missing (counts has records)")
        ],
    ),
    scales=ListOf(Optional(Tensor(FLOAT, shape=(2,))), length="modules"),  # histogram (scale, shift) per module
)
"""The format of `ActivationStats.state_dict()`; `bins` is the callback's `hist_bins`."""


class RecordsDroppedWarning(HookscopeWarning):
    """Observations were not kept because a capacity was reached (they are counted in `dropped`)."""


class ActivationStats(RecordWriter, HookCallback):
    """Record mean, std and near-zero fraction (and a histogram) of each module's output per training batch.

    For every observed training batch and every observed module, `stats[k][j]` is a dict `{'mean', 'std',
    'near_zero'}` (+ `'hist'` with `with_hist=True`): the mean and unbiased std (0 for a single value) of the
    output in float32, and the fraction of output values `<= near_zero` (fastai's definition). A module called
    several times in one batch is described by all its outputs together; a module not called has NaN values.
    Outputs that are tuples or dicts are described by their first floating-point tensor.

    Unlike fastai: statistics stay on the device until read (no host sync per layer per batch), at most
    `capacity` records are kept (later ones are counted in `dropped`), and histograms keep negatives: with
    `hist_range=None` the range is fixed, symmetric, from the first record of each module, and values outside it
    land in the end bins, so each histogram counts every value but NaNs. Outputs of 32768 values or more are
    described when their hook runs; smaller ones are copied and described together, up to 64 batches at once
    and whenever the statistics are read (a fixed number of torch calls, whatever the number of modules). Under
    `torch.compile` (attach first) the traced hooks only hand their outputs over, and the statistics are the same
    as in eager mode.

    Args:
        with_hist: Also record a histogram of each output.
        modules: Modules or selector (default: every module with parameters of its own), as `HookCallback`.
        every: Observe one training batch in `every` (`None`: all).
        near_zero: The threshold of the near-zero fraction.
        hist_bins: Number of histogram bins.
        hist_range: `(low, high)` of the histogram, or `None` for `(-a, a)`, `a` the largest absolute value of
            the module's first record.
        capacity: The most records kept.
        remove_end: As `HookCallback`.
        detach: As `HookCallback` (the statistics never keep the graph).
        cpu: Move outputs to the CPU before computing the statistics (slower; default `False`).

    Raises:
        ValueError: an argument is out of range (the message says which).

    Example:
        >>> import torch, torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> stats = ActivationStats(every=2)
        >>> with stats.attach(model):
        ...     for _ in range(5):
        ...         model(torch.randn(16, 3)).sum().backward()
        >>> len(stats.stats), sorted(stats.stats[0][1])
        (3, ['mean', 'near_zero', 'std'])
    """

    @checked(near_zero=FINITE)
    def __init__(
        self,
        with_hist: bool = False,
        modules: Selector = None,
        every: int | None = None,
        near_zero: float = 0.05,
        hist_bins: int = 40,
        hist_range: tuple[float, float] | None = None,
        capacity: int = 10_000,
        remove_end: bool = True,
        detach: bool = True,
        cpu: bool = False,
    ) -> None:
        super().__init__(modules, every, remove_end, True, detach, cpu)
        _check_options(hist_bins, hist_range, capacity)
        self.with_hist, self.near_zero, self.hist_bins = with_hist, float(near_zero), hist_bins
        self.hist_range, self.capacity = hist_range, capacity
        self.dropped = 0
        self._reset()

    def _reset(self) -> None:
        self._row = -1
        self._recording = False  # the flag traced hooks read (a bool: compiled code is reused across batches)
        self._records = 0
        self._counts: list[list[int]] = []
        self._moments: torch.Tensor | None = None  # (rows, modules, 3): mean, population variance, count <= nz
        self._hists: torch.Tensor | None = None  # (rows, modules, bins)
        self._scales: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        self._scale_table: tuple[torch.Tensor, torch.Tensor] | None = None  # (modules,) float64 each, on device
        self._cache: list[list[dict[str, Any]]] | None = None
        self._warned = False
        self._small: list[tuple[int, int, torch.Tensor]] = []  # (record, module, float64 copy) of small outputs
        self._small_values = 0
        self._large: list[tuple[int, int, int, torch.Tensor, torch.Tensor | None]] = []  # (record, module, n, ...)
        self._traced: list[tuple[int, torch.Tensor]] = []  # outputs handed over by hooks traced by torch.compile
        self._layouts: dict[tuple[tuple[int, int, int], ...], RecordLayout] = {}
        self._scratch: dict[torch.device, torch.Tensor] = {}

    def on_fit_start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Start a new set of records (as fastai) and resolve the modules."""
        self._reset()
        self.dropped = 0
        super().on_fit_start(model, optimizer)
        self._scales = [None] * len(self.paths)

    def on_batch_start(self, batch: int) -> None:
        """Open a record for an observed batch (or count it as dropped past `capacity`)."""
        if self.every is not None and batch % self.every != 0:
            return
        if self._records >= self.capacity:
            self._drop()
            return
        self._close()
        self._row = self._records
        self._recording = True
        self._records += 1
        self._counts.append([0] * len(self.paths))
        self._cache = None
        super().on_batch_start(batch)

    def on_batch_end(self, batch: int) -> None:
        """Close the open record: write its large outputs (small ones wait to be described with later ones)."""
        self._close()
        self._row, self._recording = -1, False
        super().on_batch_end(batch)

    def on_fit_end(self, error: BaseException | None = None) -> None:
        """Describe what is pending and remove the hooks (as `HookCallback`)."""
        self._settle()
        self._scratch.clear()
        super().on_fit_end(error)

    def _drop(self) -> None:
        self.dropped += 1
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"ActivationStats keeps at most capacity={self.capacity} records; later batches are counted in "
                "`dropped`, not kept (raise capacity or use every=N)",
                RecordsDroppedWarning,
                stacklevel=2,
            )

    def hook(self, m: nn.Module, i: Any, o: Any) -> Any:
        """Return `{'mean', 'std', 'near_zero'}` (float32 tensors on the output's device) for one output `o`."""
        x = _first_float(o)
        if x is None:
            return None
        xf = x.detach().float()
        std, mean = torch.std_mean(xf) if xf.numel() > 1 else (torch.zeros_like(xf.sum()), xf.sum())
        return {"mean": mean, "std": std, "near_zero": (xf <= self.near_zero).float().mean()}

    def _make_hook(self, index: int) -> HookFunction:
        record, ref = self._record, self._module_refs[index]

        def hook_fn(module: nn.Module, inputs: Any, output: Any) -> None:
            if torch.compiler.is_compiling():  # traced: read one flag, append to one list, nothing else
                x = _first_float(output)
                if self._recording and x is not None and x.numel():
                    dtype = torch.float64 if x.numel() < BATCH_BELOW else torch.float32
                    self._traced.append((index, x.detach().to(dtype, copy=True)))
            elif module is ref():  # not a deepcopy of the model, which shares the hooks
                record(index, output)

        return hook_fn

    def _record(self, index: int, output: Any) -> None:
        row = self._row
        if row < 0:
            return
        x = output if type(output) is torch.Tensor else _first_float(output)
        if x is None or not x.is_floating_point() or x.numel() == 0:
            return
        x = x.detach()
        if self.cpu:
            x = x.cpu()
        if x.numel() < BATCH_BELOW:
            self._keep_small(row, index, x)
        else:
            self._describe_large(row, index, x.reshape(-1) if x.dtype == torch.float32 else x.reshape(-1).float())

    @property
    def stats(self) -> list[list[dict[str, Any]]]:
        """Per observed batch, per observed module (model order): `{'mean', 'std', 'near_zero'(, 'hist')}`."""
        if self._cache is None:
            self._cache = self._materialize()
        return self._cache

    def _materialize(self) -> list[list[dict[str, Any]]]:
        means, stds, near_zeros = self._table()
        hists = self._hist_table()
        out = []
        for k in range(self._records):
            row = []
            for j in range(len(self.paths)):
                entry: dict[str, Any] = {"mean": means[k][j], "std": stds[k][j], "near_zero": near_zeros[k][j]}
                if hists is not None:
                    entry["hist"] = hists[k, j]
                row.append(entry)
            out.append(row)
        return out

    def _table(self) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
        self._settle()
        records, modules = self._records, len(self.paths)
        counts = torch.tensor(self._counts, dtype=torch.float64).reshape(records, modules)
        if self._moments is None:
            raw = torch.full((records, modules, 3), math.nan, dtype=torch.float64)
        else:
            raw = self._moments[:records].to("cpu", torch.float64)
        seen = counts > 0
        nan = torch.tensor(math.nan, dtype=torch.float64)
        mean = torch.where(seen, raw[..., 0], nan)
        unbiased = raw[..., 1] * counts / (counts - 1).clamp(min=1)
        std = torch.where(seen, unbiased.sqrt(), nan)
        near_zero = torch.where(seen, raw[..., 2] / counts.clamp(min=1), nan)
        return mean.float().tolist(), std.float().tolist(), near_zero.float().tolist()

    def _hist_table(self) -> torch.Tensor | None:
        self._settle()
        if not self.with_hist:
            return None
        if self._hists is None:
            return torch.zeros(self._records, len(self.paths), self.hist_bins)
        return self._hists[: self._records].cpu().clone()

    def _index(self, idx: int) -> int:
        modules = len(self.paths)
        if isinstance(idx, bool) or not isinstance(idx, int) or not -modules <= idx < modules:
            raise ValueError(f"idx must be an int in [-{modules}, {modules}) (one per observed module), got {idx!r}")
        return idx % modules

    def layer_stats(self, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return `(means, stds, near_zeros)` of module `idx` over the records, each (records,) float32.

        Raises:
            ValueError: `idx` is not the index of an observed module.
        """
        j = self._index(idx)
        means, stds, near_zeros = (torch.tensor([row[j] for row in col], dtype=torch.float32) for col in self._table())
        return means, stds, near_zeros

    def hist(self, idx: int) -> torch.Tensor:
        """Return `log1p` of the histogram counts of module `idx`, shape (bins, records).

        Raises:
            ValueError: `with_hist` is off, or `idx` is not the index of an observed module.
        """
        j = self._index(idx)
        table = self._hist_table()
        if table is None:
            raise ValueError("hist needs histograms: create ActivationStats(with_hist=True)")
        return table[:, j].t().float().log1p()

    def hist_edges(self, idx: int) -> torch.Tensor:
        """Return the (bins + 1,) bin edges of module `idx` (NaN before its first record).

        Raises:
            ValueError: `idx` is not the index of an observed module.
        """
        self._settle()
        scale_shift = self._scales[self._index(idx)] if self._scales else None
        if scale_shift is None:
            return torch.full((self.hist_bins + 1,), math.nan)
        scale, shift = (float(t) for t in scale_shift)
        return (torch.arange(self.hist_bins + 1, dtype=torch.float64) - shift).div(scale).float()

    def color_dim(self, idx: int, figsize: tuple[float, float] = (10, 5), ax: Any = None) -> Any:
        """Draw the "colorful dimension" plot of module `idx` (histograms over records); return the Figure."""
        from ..plot import color_dim

        return color_dim(self.hist(idx), figsize=figsize, ax=ax)

    def plot_layer_stats(self, idx: int) -> Any:
        """Plot mean, std and % near zero of module `idx` over the records; return the Figure."""
        from ..plot import layer_stats

        return layer_stats(*self.layer_stats(idx), near_zero=self.near_zero)

    def state_dict(self) -> dict[str, Any]:
        """Return the records (on the CPU), counts and histogram ranges."""
        self._settle()
        table = {"counts": torch.tensor(self._counts, dtype=torch.int64).reshape(self._records, len(self.paths))}
        if self._moments is not None:
            table["moments"] = self._moments[: self._records].cpu().clone()
        if self._hists is not None:
            table["hists"] = self._hists[: self._records].cpu().clone()
        scales = [None if s is None else torch.stack(s).cpu() for s in self._scales]
        return {"paths": list(self.paths), "dropped": self.dropped, "tensors": table, "scales": scales}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore records saved by `state_dict` (the modules are resolved again at fit start).

        The state is checked in full first: a refused state leaves the records as they were.

        Raises:
            ValueError: the state does not fit the format (the field is named), or was saved for other modules.
        """
        check(STATE, state, bind={"bins": self.hist_bins})
        if self.paths and list(state["paths"]) != self.paths:
            raise ValueError(f"state must be for modules {self.paths}, got {state['paths']}")
        self.paths, self.dropped = list(state["paths"]), state["dropped"]
        tensors = state["tensors"]
        self._counts = tensors["counts"].tolist()
        self._records = len(self._counts)
        self._moments, self._hists = tensors.get("moments"), tensors.get("hists")
        self._scales = [None if s is None else (s[0], s[1]) for s in state["scales"]]
        self._scale_table = None
        self._layouts.clear()
        self._cache = None


def _check_options(hist_bins: int, hist_range: tuple[float, float] | None, capacity: int) -> None:
    if isinstance(hist_bins, bool) or not isinstance(hist_bins, int) or hist_bins < 1:
        raise ValueError(f"hist_bins must be a positive int, got {hist_bins!r}")
    if hist_range is not None:
        low, high = hist_range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"hist_range must be (low, high) with finite low < high, or None, got {hist_range!r}")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")


def _first_float(output: Any) -> torch.Tensor | None:
    for _, tensor in tensor_leaves(output):
        if tensor.is_floating_point():
            return tensor
    return None
