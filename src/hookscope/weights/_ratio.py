"""The update-to-weight ratio of each layer after every optimizer step, kept on the device."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .._check import aliases, checked
from .._schema import Int, ListOf, Optional, Record, Str, check
from .._torch import foreach_copy_
from ..hooks import HookHandle, register_optimizer_hook
from ..hooks._calls import HookErrors
from ..hooks._select import Selector
from ..stats._norms import norm_of, ratio_of_norms
from ..stats._sample import Sampler
from ._layers import weight_layers, weight_parameter
from ._nested import is_nested_step
from ._rows import STATE as LOG_STATE
from ._rows import RowLog

__all__ = ["STATE", "UpdateRatioMonitor"]

STATE = Record(layer_names=ListOf(Str(), length="width"), log=LOG_STATE, capacity=Optional(Int(min=1)))
"""The format of `UpdateRatioMonitor.state_dict()`: one log column per layer."""

_TAGS = ("hookscope.weights", "update_ratio")


class UpdateRatioMonitor:
    """Record ||W_after - W_before|| / ||W_after|| for each chosen layer's weight after every optimizer step.

    A ratio far from about 1e-3 is the classic sign of a learning rate that is too high (>> 1e-3) or too low
    (<< 1e-3). Step pre/post hooks copy the weights into reused buffers and compute the ratios on the device
    (no host sync); they are read when asked. History is a ring buffer of `capacity` steps (`None`: every
    step) with a `dropped` count. `reducer_factory` (e.g. a `hookscope` reducer class) gives each layer a
    reducer whose `push(ratio)` receives its 0-d ratio tensor every step. A failure inside its hooks never
    reaches the training: it is counted in `errors.failures` and warned once.

    Example:
        >>> import torch, torch.nn as nn
        >>> model = nn.Linear(4, 4)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = UpdateRatioMonitor().attach(model, optimizer)
        >>> model(torch.randn(2, 4)).sum().backward(); optimizer.step()
        >>> monitor.steps, list(monitor.latest())
        (1, [''])
    """

    @checked()
    def __init__(self, capacity: int | None = 1000, *, reducer_factory: Callable[[], Any] | None = None) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a positive int or None, got {capacity!r}")
        self.capacity = capacity
        self.reducer_factory = reducer_factory
        self.layer_names: list[str] = []
        self.reducers: dict[str, Any] = {}
        self._weights: list[torch.Tensor] = []
        self._before: list[torch.Tensor] = []
        self._log = RowLog(0, capacity)
        self._handles: list[HookHandle] = []
        self._sampler = Sampler()
        self.errors = HookErrors("UpdateRatioMonitor", counter="monitor.errors.failures")  # hooks never raise

    @property
    def steps(self) -> int:
        """Optimizer steps recorded."""
        return self._log.count

    @property
    def dropped(self) -> int:
        """Steps recorded but no longer kept (past `capacity`)."""
        return self._log.dropped

    @aliases(layer_names="select")
    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer, select: Selector = None) -> UpdateRatioMonitor:
        """Watch the chosen layers' weights around every `optimizer.step()`; returns self (`with` detaches).

        Raises:
            RuntimeError: the monitor is already attached.
            ValueError: no chosen layer's weight is optimized by `optimizer`.
        """
        if self._handles:
            raise RuntimeError("UpdateRatioMonitor is already attached; call detach() before attaching again")
        optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
        layers = [(p, weight_parameter(m)) for p, m in weight_layers(model, select)]
        layers = [(path, weight) for path, weight in layers if id(weight) in optimized]
        if not layers:
            raise ValueError("select must choose layers whose weights the optimizer updates, got none of them")
        names = [path for path, _ in layers]
        if names != self.layer_names:
            self.layer_names, self._log = names, RowLog(len(names), self.capacity)
            self.reducers = {path: self.reducer_factory() for path in names} if self.reducer_factory else {}
        self._weights = [weight for _, weight in layers]
        errors = self.errors
        self._handles = [
            register_optimizer_hook(optimizer, "step_pre", self._before_step, owner=self, tags=_TAGS, errors=errors),
            register_optimizer_hook(optimizer, "step_post", self._after_step, owner=self, tags=_TAGS, errors=errors),
        ]
        return self

    def detach(self) -> None:
        """Remove the hooks (the history stays readable); calling it again does nothing."""
        while self._handles:
            self._handles.pop().remove()
        self._weights, self._before = [], []

    def remove(self) -> None:
        """Same as `detach()`: every attachment's handle has `remove()`."""
        self.detach()

    def __enter__(self) -> UpdateRatioMonitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.detach()

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if is_nested_step(optimizer):
            return
        with torch.no_grad():
            if len(self._before) != len(self._weights):
                self._before = [w.detach().clone() for w in self._weights]
            else:
                foreach_copy_(self._before, [w.detach() for w in self._weights])

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if is_nested_step(optimizer):
            return
        with torch.no_grad():
            device = self._weights[0].device
            pairs = zip(self._weights, self._before, strict=True)
            update = torch.stack([norm_of(w.detach() - b, self._sampler)[0].to(device) for w, b in pairs])
            weight = torch.stack([norm_of(w.detach(), self._sampler)[0].to(device) for w in self._weights])
            ratios = ratio_of_norms(update, weight).float()
        self._log.append(ratios)
        for path, ratio in zip(self.layer_names, ratios, strict=True):
            if path in self.reducers:
                self.reducers[path].push(ratio)

    def ratios(self) -> torch.Tensor:
        """The kept ratios on the device, oldest step first. Shape: `(kept steps, layers)`."""
        return self._log.rows()

    def latest(self) -> dict[str, float]:
        """Path -> the ratio of the latest step (empty before the first step)."""
        row = self._log.last()
        return {} if row is None else dict(zip(self.layer_names, row.tolist(), strict=True))

    def history(self) -> dict[str, list[float]]:
        """Path -> the kept ratios, oldest first (one host sync)."""
        columns = self._log.rows().T.tolist() if len(self._log) else [[] for _ in self.layer_names]
        return dict(zip(self.layer_names, columns, strict=True))

    def diagnose(self, low: float = 1e-4, high: float = 1e-2) -> dict[str, str]:
        """Path -> `"too low"`, `"too high"` or `"not finite"` for layers whose median kept ratio is off.

        Raises:
            ValueError: the bounds are not 0 < low < high.
        """
        if not 0 < low < high:
            raise ValueError(f"low and high must satisfy 0 < low < high, got low={low!r}, high={high!r}")
        if len(self._log) == 0:
            return {}
        medians = self._log.rows().median(dim=0).values.tolist()
        verdicts = {}
        for path, median in zip(self.layer_names, medians, strict=True):
            if math.isnan(median) or math.isinf(median):
                verdicts[path] = "not finite"
            elif median < low:
                verdicts[path] = "too low"
            elif median > high:
                verdicts[path] = "too high"
        return verdicts

    def state_dict(self) -> dict[str, Any]:
        """The kept ratios, counters and layer names (reducers keep their own state)."""
        return {"layer_names": list(self.layer_names), "log": self._log.state_dict(), "capacity": self.capacity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, e.g. to resume a run.

        Raises:
            ValueError: the state was saved for other layers or another capacity, or does not fit the format
                (the field is named); the monitor is left as it was.
        """
        check(STATE, state)
        if state["capacity"] != self.capacity or (self.layer_names and state["layer_names"] != self.layer_names):
            raise ValueError(
                f"state must be for capacity {self.capacity} and layers {self.layer_names}, got capacity "
                f"{state['capacity']} and layers {state['layer_names']}"
            )
        log = RowLog(len(state["layer_names"]), self.capacity)
        log.check_state(state["log"], at="state.log")
        log.load_state_dict(state["log"])
        self.layer_names, self._log = list(state["layer_names"]), log
