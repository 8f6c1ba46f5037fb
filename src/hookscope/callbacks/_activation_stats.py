"""`ActivationStats`: fastai's per-batch activation statistics, by the engine's definitions, on the device."""

from __future__ import annotations

import math
import threading
import time
import warnings
import weakref
from typing import Any

import torch
import torch.nn as nn

from .._check import FINITE, checked
from .._errors import HookscopeWarning
from .._schema import check
from ..hooks import HookHandle
from ..hooks._calls import HookErrors, contained
from ..hooks._guards import check_real_device
from ..hooks._select import Selector
from ..hooks._tree import first_float, is_plain
from ..stats._describe import describe
from ..stats._histogram import EXPONENT_NONE, auto_edges, check_bins, check_range, fixed_edges, on_widest_range
from ..stats._record import RECORD, STATISTICS, finalize
from ..stats._sample import Sampler
from ..stats._spec import Spec
from ..stats._tables import SMALL_BELOW, RecordTable
from ._activation_state import STATE
from ._base import LoopDriver
from ._budget import Budget, check_budget, later_part
from ._hook_callback import HookCallback, HookFunction
from ._steps import ForwardFrames, Frame, uncounted

__all__ = ["NEAR", "STATE", "ActivationStats", "RecordsDroppedWarning"]

NEAR = "near_zero"
"""The key of fastai's signed near-zero fraction (`x <= near_zero`)."""

FLUSH_RECORDS = 64
"""Records whose small outputs wait before they are described together."""
FLUSH_VALUES = 1 << 20
"""Small values waiting (float32, 4 MiB) that make a record's end describe them."""


class RecordsDroppedWarning(HookscopeWarning):
    """Observations were not kept because a capacity was reached (they are counted in `dropped`)."""


class ActivationStats(HookCallback):
    """Record mean, std and fastai's near-zero fraction (and a histogram) of each module's output per batch.

    For every observed training batch and every observed module, `stats[k][j]` is a dict with `'mean'`,
    `'std'` (Bessel's correction, 0 for a single value), `'near_zero'` (fastai's key and rule: the fraction of
    finite output values `x <= near_zero`, signed, so every negative value counts; watch() and the reducers
    report the fraction with `|x| <= near_zero` under that name) and `'sampled'` (the fraction of the
    values whose statistics were estimated from a sample), plus `'hist'` with `with_hist=True`. Every statistic
    is the engine's (`hookscope.stats`): non-finite values are counted apart and never enter the others. A module
    called several times in one batch is described by all its outputs together; a module not called has NaN
    values. Outputs that are tuples or dicts are described by their first floating-point tensor.

    Unlike fastai: statistics stay on the device until read (no host sync per layer per batch), at most
    `capacity` records are kept (later ones are counted in `dropped`), and histograms keep negatives over a range
    that follows the data (a symmetric power of two, widened and re-binned exactly when larger values come), so
    no value is clamped into an end bin. Outputs of fewer than 16384 values are copied and described together,
    up to 64 batches at once and whenever the statistics are read (a fixed number of torch calls, whatever the
    number of modules); larger ones are read when their hook runs: exact count, sum, min, max and non-finite
    count, and a systematic sample of 7700 to 8192 values for the rest, unless `exact=True` (see `hookscope.stats`
    for the error bounds). Under
    `torch.compile` (attach first) the traced hooks only hand their outputs over, and the statistics are the same
    as in eager mode.

    Args:
        with_hist: Also record a histogram of each output.
        modules: Modules or selector (default: every module with parameters of its own), as `HookCallback`.
        every: Observe exactly one training batch in `every` (`None`: as `budget` says).
        near_zero: The threshold of fastai's near-zero fraction (`x <= near_zero`).
        hist_bins: Number of histogram bins (even, for the automatic range).
        hist_range: `(low, high)` of the histogram (values outside are counted apart), or `None` for a range
            that follows the data.
        capacity: The most records kept.
        remove_end: As `HookCallback`.
        detach: As `HookCallback` (the statistics never keep the graph).
        cpu: Move outputs to the CPU before computing the statistics (slower; default `False`).
        exact: Describe every value of large outputs (slower) instead of a sample.
        strict: Raise failures of its hooks instead of counting them; `None` reads `HOOKSCOPE_STRICT`.
        include_paramless: With `modules=None`, also record the leaf modules without parameters, as fastai.
        budget: With `every=None`, the largest share of the run's time the statistics may take (default 0.03:
            about 1.03 times the bare step): the first 16 batches are observed, then as many as the budget allows
            (see `hookscope.callbacks._budget`), and on the others the hooks are off the modules. `None`: every
            batch, as fastai. `batches` says which batches the records are of, `measured` how many began and
            what observing them cost.

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
        (3, ['mean', 'near_zero', 'sampled', 'std'])
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
        exact: bool = False,
        strict: bool | None = None,
        include_paramless: bool = False,
        budget: float | None = 0.03,
    ) -> None:
        super().__init__(modules, every, remove_end, True, detach, cpu, include_paramless)
        self.budget = check_budget(budget, "every batch")
        self.hist_range = check_range("hist_range", hist_range)
        self.hist_bins = check_bins("hist_bins", hist_bins, automatic=self.hist_range is None)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if isinstance(near_zero, bool) or not isinstance(near_zero, (int, float)) or not math.isfinite(near_zero):
            raise ValueError(f"near_zero must be a finite number, got {near_zero!r}")
        self.with_hist, self.near_zero, self.capacity, self.exact = bool(with_hist), float(near_zero), capacity, exact
        self.dropped = 0
        self.dropped_reasons: dict[str, int] = {}
        self.errors = HookErrors("ActivationStats", strict, self._count_dropped)
        self._lock = threading.RLock()  # hooks from several threads record one at a time
        self._frames: ForwardFrames | None = None
        self._frame_handles: list[HookHandle] = []
        self._driver: weakref.ref[LoopDriver] | None = None  # its own loop driver (`attach`), which lets the
        # middle batches of a stretch pass without an event
        self._reset()

    def _reset(self) -> None:
        self.batches: list[int] = []  # the training batch of each record
        self._timer = Budget(self.budget, 1) if self.every is None and self.budget is not None else None
        self._row = -1
        self._recording = False  # the flag traced hooks read (a bool: compiled code is reused across batches)
        self._records = 0
        self._unflushed = 0  # records closed since the last flush
        self._table: RecordTable | None = None
        self._cache: list[list[dict[str, Any]]] | None = None
        self._warned = False
        self._traced: list[tuple[int, torch.Tensor]] = []  # outputs handed over by hooks traced by torch.compile
        self._filled: set[int] = set()  # records something was kept in
        self._stretch = (0, 0)  # (first batch, count) of a stretch of batches left alone (`Budget.stretch`)
        self._stretch_left = 0  # its batches still to begin
        self._marks: list[float] = []  # when its later part and its last batch began: the later part timed apart
        self._last_batch = -1  # the last training batch seen to begin (its own driver numbers those a stretch
        # let pass: `measured` asks it)

    def _new_table(self) -> RecordTable:
        return RecordTable(
            len(self.paths),
            Spec(near_zero=self.near_zero, signed=True),
            bins=self.hist_bins if self.with_hist else None,
            hist_range=self.hist_range,
            sampler=None if self.exact else Sampler(),
        )

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> LoopDriver:
        """Record the batches of a plain training loop over `model`: see `Callback.attach`."""
        driver = super().attach(model, optimizer)
        self._driver = weakref.ref(driver)  # it drives this callback alone (set after `on_fit_start`)
        return driver

    def on_fit_start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Start a new set of records (as fastai) and resolve the modules.

        Raises:
            ValueError: `model` is on the meta device.
        """
        check_real_device(model, "model")
        self._driver = None  # `attach` sets its own driver once it started; any other driver drives others too
        self._reset()
        self.dropped = 0
        self.dropped_reasons = {}
        super().on_fit_start(model, optimizer)
        self._table = self._new_table()
        self._frames = ForwardFrames(True, self._frame_ended, self._frame_began)
        self._frame_handles = self._frames.register(model, owner=self, tags=("ActivationStats",), errors=self.errors)

    def _hook_errors(self) -> HookErrors | None:
        return self.errors

    def _count_dropped(self, reason: str, count: int = 1) -> None:
        self.dropped += count
        self.dropped_reasons[reason] = self.dropped_reasons.get(reason, 0) + count

    def _frame_began(self, frame: Frame) -> None:
        """A root forward that is not part of a step began: traced (compiled) hooks record nothing during it."""
        if frame.reason is not None:
            frame.saved, self._recording = self._recording, False

    def _frame_ended(self, frame: Frame, completed: bool) -> None:
        """A root forward ended: keep what its hooks staged if it completed; one that raised is counted as
        dropped, and the record it opened is taken back when nothing else went into it."""
        with self._lock:
            if frame.saved is not None:
                self._recording = frame.saved
            if completed:
                for staged in frame.items:
                    self._keep(staged)
                return
            if frame.items:
                self._count_dropped("raised", len(frame.items))
            row = self._row
            if frame.reason is None and row == self._records - 1 and row >= 0 and row not in self._filled:
                self._records -= 1
                self.batches.pop()
                self._row, self._recording = -1, False

    @contained
    def on_batch_start(self, batch: int) -> None:
        """Open a record for an observed batch (or count it as dropped past `capacity`)."""
        self.train_iter = self._last_batch = batch
        if self.every is not None and batch % self.every != 0:
            return
        timer = self._timer
        if timer is not None and self._in_stretch(timer):
            return
        if timer is not None and not timer.begin(batch):  # left alone: the hooks are off the modules
            if self.is_registered:
                with timer.timed():
                    self.pause()
            count = timer.stretch(batch) - 1  # the next ones may be foreseen, and only counted
            if count >= 2:
                self._stretch, self._stretch_left = (batch + 1, count), count
            return
        if self._records >= self.capacity:
            self._drop()
            return
        start = time.perf_counter()
        self._close()
        self._row = self._records
        self._recording = True
        self._records += 1
        self.batches.append(batch)
        self._cache = None
        super().on_batch_start(batch)
        if timer is not None:
            self.register()  # back on the modules after batches left alone
            timer.add_own(time.perf_counter() - start)

    def _in_stretch(self, timer: Budget) -> bool:
        """Whether this batch is one of a stretch of batches left alone: counted, nothing else. The two root hooks
        (`ForwardFrames`) are off the model from its first batch to its last, whose end puts them back for the
        batch after it; that batch counts the stretch's time (`Budget.stretch_ended`), its later part (`later_part`,
        from the batch that begins it to the last batch) timed apart."""
        first, count = self._stretch
        left = self._stretch_left
        later = later_part(count)
        if not left:
            if count:  # the stretch ended with the batch before this one
                marks = self._marks
                timer.stretch_ended(first, count, (marks[1] - marks[0], later) if len(marks) == 2 else None)
                self._stretch = (0, 0)
            return False
        driver = None if self._driver is None else self._driver()
        if left == count:  # its first batch: the batch before it ends now, and the root hooks come off
            timer.end()
            self._marks = []
            for handle in self._frame_handles:
                handle.pause()
            if self._frames is not None:
                self._frames.drop_current()  # this forward's frame: the paused hook will not close it
            if driver is not None and count > 2:  # its middle batches pass its own driver without an event; it
                driver.skip_batches(count - 2, later - 1)  # marks when the later part begins
                left = 2  # its first and last batches are seen
        elif later and left == later + 1:  # seen by another driver: the later part begins with this batch
            self._marks = [time.perf_counter()]
        self._stretch_left = left = left - 1
        if not left:  # its last batch: the root hooks go back on (this forward's end closes no frame)
            marked = driver.marked if driver is not None and count > 2 else None
            if marked is not None:
                self._marks = [marked]
            if len(self._marks) == 1:
                self._marks.append(time.perf_counter())
            for handle in self._frame_handles:
                handle.resume()
        return True

    @contained
    def on_batch_end(self, batch: int) -> None:
        """Close the open record (its small outputs wait to be described with later ones)."""
        if self._stretch[1] and self._row < 0:  # a batch of a stretch left alone, or the one before: no record
            return
        timer = self._timer
        if timer is not None and self._row >= 0:
            with timer.timed():  # closing a record, and describing the waiting ones, is its cost too
                self._close()
        else:
            self._close()
        self._row, self._recording = -1, False
        super().on_batch_end(batch)

    def on_fit_end(self, error: BaseException | None = None) -> None:
        """Describe what is waiting and remove the hooks (as `HookCallback`)."""
        try:
            with self._lock:
                self._last_batch = self._batches_begun() - 1  # its driver may not outlive the fit
                self._settle()
        except Exception as err:
            self.errors.failed(err, "on_fit_end")
        finally:
            while self._frame_handles:
                self._frame_handles.pop().remove()
            super().on_fit_end(error)

    def _drop(self) -> None:
        self._count_dropped("capacity")
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"ActivationStats keeps at most capacity={self.capacity} records; later batches are counted in "
                "`dropped`, not kept (raise capacity or use every=N)",
                RecordsDroppedWarning,
                stacklevel=2,
            )

    def hook(self, m: nn.Module, i: Any, o: Any) -> Any:
        """Return `{'mean', 'std', 'near_zero'}` (0-d float64 tensors on the output's device) of `o`."""
        x = first_float(o)
        if x is None:
            return None
        values = dict(zip(STATISTICS, finalize(describe(x, Spec(self.near_zero, signed=True)).record), strict=True))
        return {"mean": values["mean"], "std": values["std"], NEAR: values["near_zero"]}

    def _make_hook(self, index: int) -> HookFunction:
        ref = self._module_refs[index]

        def hook_fn(module: nn.Module, inputs: Any, output: Any) -> None:
            if torch.compiler.is_compiling():  # traced: read one flag, append to one list, nothing else
                x = first_float(output)
                if self._recording and x is not None and x.numel():
                    self._traced.append((index, x.detach().to(torch.float32, copy=True)))
            elif module is ref():  # not a deepcopy of the model, which shares the hooks
                start = time.perf_counter()
                with self._lock:
                    self._on_output(index, module, output)
                if self._timer is not None:
                    self._timer.add_own(time.perf_counter() - start)

        return hook_fn

    def _on_output(self, index: int, module: nn.Module, output: Any) -> None:
        """Apply the step rule: what a call inside a root forward records waits for that forward to complete."""
        if self._row < 0:
            return
        frame = self._frames.current() if self._frames is not None else None
        reason = uncounted(module) if frame is None else frame.reason
        if reason is not None:
            self._count_dropped(reason)
            return
        staged = self._record(index, output)
        if staged is None:
            return
        if frame is not None:
            frame.items.append(staged)
        else:
            self._keep(staged)

    def _record(self, index: int, output: Any) -> tuple[Any, ...] | None:
        """Read an output (a copy when small; its sums and a sample, or every value, when large: in cache,
        before in-place ops change it) and return what to keep (`_keep`)."""
        row, table = self._row, self._table
        x = output if type(output) is torch.Tensor else first_float(output)
        if row < 0 or table is None or x is None or not x.is_floating_point() or x.numel() == 0 or not is_plain(x):
            return None
        x = x.detach()
        if self.cpu:
            x = x.cpu()
        self._allocate(table, row, x.device)
        return table.stage(row, index, x)

    def _keep(self, staged: tuple[Any, ...]) -> None:
        if self._table is not None:
            self._table.commit(staged)
            self._filled.add(staged[1])

    def _allocate(self, table: RecordTable, row: int, device: torch.device) -> None:
        if table.rows <= row or table.device != device:
            table.allocate(min(self.capacity, max(64, 2 * (row + 1))), device)

    def _close(self) -> None:
        """The open record ends: take what traced hooks handed over; describe the waiting outputs if enough are."""
        traced, self._traced = self._traced, []
        table = self._table
        if table is None:
            return
        for index, tensor in traced if self._row >= 0 else ():
            self._allocate(table, self._row, tensor.device)
            staged = table.stage(self._row, index, tensor, owned=tensor.numel() < SMALL_BELOW)
            if staged is not None:
                self._keep(staged)
        if self._row >= 0:
            self._unflushed += 1
        if self._unflushed >= FLUSH_RECORDS or table.pending_values >= FLUSH_VALUES:
            self._settle()

    def _settle(self) -> None:
        """Write everything waiting into the records (before they are read)."""
        self._unflushed = 0
        if self._table is not None:
            self._table.flush()

    # ---- reading ---------------------------------------------------------------------------------------------
    @property
    def measured(self) -> dict[str, Any]:
        """Which training batches were observed and what that cost, in the terms of `watch()`'s
        `results().meta["measured"]`: `steps` (the training batches that began, observed or not), `budget` (under
        the budget) or `every` (1 without a budget), `cost` (its own host time over the rest of the batches' time:
        0.03 is 1.03 times the bare batch; `None` without a budget, which times nothing, or before a batch ended)
        and `recorded` (the records kept, of the batches `batches` lists). Under the budget, also `seconds` (its
        own and the batches' total), `step_cost` and `after_warmup` (`hookscope.callbacks._budget.Budget.summary`).
        The root pre-hook that numbers the batches left alone is not in `cost` (see `make bench`)."""
        with self._lock:
            steps = self._batches_begun()
            if self._timer is None:
                found: dict[str, Any] = {"steps": steps, "every": self.every or 1, "cost": None}
            else:
                found = {**self._timer.summary(), "steps": steps}
            return {**found, "recorded": len(self.batches)}

    def _batches_begun(self) -> int:
        """The training batches that began so far: its own driver's count (a stretch of batches left alone passes
        it without an event), else the last batch seen."""
        driver = None if self._driver is None else self._driver()
        return max(self._last_batch, driver.batch if driver is not None else -1) + 1

    @property
    def stats(self) -> list[list[dict[str, Any]]]:
        """Per observed batch, per observed module (model order): `{'mean', 'std', 'near_zero', 'sampled'
        (, 'hist')}` as floats (`'hist'`: a (bins,) tensor on the module's common range, `hist_edges(idx)`)."""
        if self._cache is None:
            self._cache = self._materialize()
        return self._cache

    def _statistics(self) -> torch.Tensor:
        """(records, modules, len(STATISTICS)) float64 on the CPU; NaN where a module was not observed."""
        self._settle()
        table, shape = self._table, (self._records, len(self.paths))
        if table is None or table.records is None:
            return finalize(torch.zeros(*shape, len(RECORD), dtype=torch.float64))
        return finalize(table.records[: self._records].cpu())

    def _materialize(self) -> list[list[dict[str, Any]]]:
        values = self._statistics()
        # float64 to Python floats, exactly: a std of finite float32 or bf16 values can exceed the float32 maximum
        columns = {name: values[..., STATISTICS.index(name)].tolist() for name in ("mean", "std", "sampled")}
        columns[NEAR] = values[..., STATISTICS.index("near_zero")].tolist()
        hists = self._hist_table() if self.with_hist else None
        out = []
        for k in range(self._records):
            row = []
            for j in range(len(self.paths)):
                entry: dict[str, Any] = {name: column[k][j] for name, column in columns.items()}
                if hists is not None:
                    entry["hist"] = hists[j][0][k, : self.hist_bins]
                row.append(entry)
            out.append(row)
        return out

    def _hist_table(self) -> list[tuple[torch.Tensor, int]]:
        """Per module: its (records, bins + 2) float64 counts on its common range, and that range's exponent."""
        self._settle()
        table, width = self._table, self.hist_bins + 2
        if table is None or table.hists is None or table.exponents is None:
            return [(torch.zeros(self._records, width, dtype=torch.float64), EXPONENT_NONE) for _ in self.paths]
        hists, exponents = table.hists[: self._records].cpu(), table.exponents[: self._records].cpu()
        out = []
        for j in range(len(self.paths)):
            widened, target = on_widest_range(hists[:, j], exponents[:, j])
            counts = hists[:, j] if self.hist_range is not None else widened
            out.append((counts, int(target)))
        return out

    def _index(self, idx: int) -> int:
        modules = len(self.paths)
        if isinstance(idx, bool) or not isinstance(idx, int) or not -modules <= idx < modules:
            raise ValueError(f"idx must be an int in [-{modules}, {modules}) (one per observed module), got {idx!r}")
        return idx % modules

    def layer_stats(self, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return `(means, stds, near_zeros)` of module `idx` over the records, each (records,) float64.

        Raises:
            ValueError: `idx` is not the index of an observed module.
        """
        j = self._index(idx)
        values = self._statistics()[:, j]
        return tuple(values[:, STATISTICS.index(name)] for name in ("mean", "std", "near_zero"))  # type: ignore[return-value]

    def hist_counts(self, idx: int) -> torch.Tensor:
        """Return the (records, bins + 2) float64 histogram counts of module `idx` on its common range (`hist_edges`):
        the bins, then the values below and above a fixed `hist_range` (always 0 for a range that follows the data).

        Raises:
            ValueError: `with_hist` is off, or `idx` is not the index of an observed module.
        """
        j = self._index(idx)
        if not self.with_hist:
            raise ValueError("hist needs histograms: create ActivationStats(with_hist=True)")
        return self._hist_table()[j][0]

    def hist(self, idx: int) -> torch.Tensor:
        """Return `log1p` of the histogram counts of module `idx`, shape (bins, records), on `hist_edges(idx)`.

        Raises:
            ValueError: `with_hist` is off, or `idx` is not the index of an observed module.
        """
        return self.hist_counts(idx)[:, : self.hist_bins].t().float().log1p()

    def hist_edges(self, idx: int) -> torch.Tensor:
        """Return the (bins + 1,) float64 bin edges of module `idx` (its common range over the records).

        Raises:
            ValueError: `idx` is not the index of an observed module.
        """
        j = self._index(idx)
        if self.hist_range is not None:
            return fixed_edges(self.hist_range, self.hist_bins)
        exponent = self._hist_table()[j][1] if self.with_hist else EXPONENT_NONE
        return auto_edges(exponent, self.hist_bins)

    def color_dim(self, idx: int, figsize: tuple[float, float] = (10, 5), ax: Any = None) -> Any:
        """Draw the "colorful dimension" plot of module `idx` (histograms over records); return the Figure."""
        from ..plot._images import color_dim

        return color_dim(self.hist(idx), figsize=figsize, ax=ax)

    def plot_layer_stats(self, idx: int) -> Any:
        """Plot mean, std and % at most near zero of module `idx` over the records; return the Figure."""
        from ..plot._images import layer_stats

        return layer_stats(*self.layer_stats(idx), near_zero=self.near_zero)

    # ---- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return the records (on the CPU): per record and module its moments record, histogram and exponent."""
        with self._lock:
            self._settle()
            table, records = self._table, self._records
            tensors: dict[str, torch.Tensor] = {}
            if table is not None and table.records is not None:
                tensors["records"] = table.records[:records].cpu().clone()
                if table.hists is not None and table.exponents is not None:
                    tensors["hists"] = table.hists[:records].cpu().clone()
                    tensors["exponents"] = table.exponents[:records].cpu().clone()
            saved = {"paths": list(self.paths), "dropped": self.dropped, "records": records, "tensors": tensors}
            return {**saved, "batches": list(self.batches[:records])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore records saved by `state_dict` (the modules are resolved again at fit start); all or nothing.

        Raises:
            ValueError: the state does not fit the format (the field is named), or was saved for other modules.
        """
        with self._lock:
            check(STATE, state, bind={"bins": self.hist_bins})
            if self.paths and list(state["paths"]) != self.paths:
                raise ValueError(f"state must be for modules {self.paths}, got {state['paths']}")
            self.paths, self.dropped = list(state["paths"]), state["dropped"]
            records = self._records = state["records"]
            self.batches = list(state.get("batches", ()))  # empty for a state saved before batches were kept
            self._cache = None
            table = self._table = self._new_table()
            tensors = state["tensors"]
            if "records" in tensors and records:
                table.allocate(max(records, 1), torch.device("cpu"))
                if table.records is not None:
                    table.records[:records] = tensors["records"]
                if table.hists is not None and table.exponents is not None and "hists" in tensors:
                    table.hists[:records] = tensors["hists"]
                    table.exponents[:records] = tensors["exponents"]
