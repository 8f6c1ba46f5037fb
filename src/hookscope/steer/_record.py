"""Recording: the value of each selected site on every call, detached, optionally offloaded and bounded in bytes."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

import torch
import torch.nn as nn

from .._check import DEVICE, POSITIVE, checked, one_of
from .._errors import HookscopeWarning
from ..hooks._calls import HookErrors, user_stacklevel
from ..hooks._select import Selector
from ._sites import AT, place_all, resolve

__all__ = ["Recording", "record"]


class Recording(Mapping[str, torch.Tensor]):
    """Site path -> the value of that site's last call (detached); `calls(path)` gives every call.

    A site whose values would pass `max_bytes` is left out whole (`path in rec` is False) and listed in
    `dropped`, so what the mapping holds is always complete.

    Attributes:
        at: "input" or "output".
        sites: Every site recorded or dropped, in model order.
        dropped: The sites left out because they would pass `max_bytes`, in the order they were dropped.
        max_bytes: The bound on the bytes kept (`None`: no bound).
    """

    def __init__(self, sites: list[str], at: str, max_bytes: int | None, device: torch.device | None) -> None:
        self.at = at
        self.sites = sites
        self.max_bytes = max_bytes
        self.dropped: list[str] = []
        self._device = device
        self._values: dict[str, list[torch.Tensor]] = {}
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """How many bytes the kept values take."""
        return self._bytes

    def calls(self, path: str) -> list[torch.Tensor]:
        """The value of every call of the site `path`, in call order.

        Raises:
            KeyError: `path` was not recorded (never called, dropped, or not a site); the message says which.
        """
        if path not in self._values:
            raise KeyError(self._missing(path))
        return list(self._values[path])

    def __getitem__(self, path: str) -> torch.Tensor:
        values = self._values.get(path)
        if not values:
            raise KeyError(self._missing(path))
        return values[-1]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        parts = [f"{path}: {tuple(self[path].shape)}" for path in self]
        shown = ", ".join(parts[:6]) + (f", ... {len(parts) - 6} more" if len(parts) > 6 else "")
        dropped = f", dropped={self.dropped!r}" if self.dropped else ""
        return f"Recording(at={self.at!r}, {{{shown}}}{dropped})"

    def _missing(self, path: str) -> str:
        if path in self.dropped:
            return f"{path!r} was dropped: its values would pass max_bytes={self.max_bytes}"
        if path in self.sites:
            return f"{path!r} was never called while recording"
        return f"{path!r} is not a recorded site; the sites are {self.sites!r}"

    def _keep(self, path: str, value: torch.Tensor) -> None:
        """Store one call's value, or drop the whole site if it would pass `max_bytes` (warned once per site)."""
        if path in self.dropped:
            return
        value = value.detach()
        if self._device is not None:
            value = value.to(self._device)
        size = value.numel() * value.element_size()
        if self.max_bytes is not None and self._bytes + size > self.max_bytes:
            self._drop(path, size)
            return
        self._values.setdefault(path, []).append(value)
        self._bytes += size

    def _drop(self, path: str, size: int) -> None:
        released = self._values.pop(path, [])
        self._bytes -= sum(v.numel() * v.element_size() for v in released)
        self.dropped.append(path)
        warnings.warn(
            f"steer.record: site {path!r} is left out: keeping its value ({size} bytes) would pass "
            f"max_bytes={self.max_bytes} ({self._bytes} bytes kept). It is listed in rec.dropped; raise max_bytes, "
            "select fewer sites or pass device='cpu'.",
            HookscopeWarning,
            stacklevel=user_stacklevel(),
        )


@checked(at=one_of(AT), max_bytes=POSITIVE, device=DEVICE)
def record(
    model: nn.Module,
    select: Selector,
    *,
    at: str = "output",
    max_bytes: int | None = None,
    device: str | torch.device | None = None,
) -> AbstractContextManager[Recording]:
    """Record the value of every site `select` picks while the block runs; the hooks go on exit, even on error.

    Args:
        model: Any `nn.Module` (DDP, compiled and FSDP wrappers are seen through).
        select: Which modules: a path, a glob (`"blocks.*"`), a module type, a list... (`hookscope.hooks`' one
            selector language).
        at: "output" (a module's output, its first tensor if it returns several) or "input" (its first input).
        max_bytes: Keep at most this many bytes; a site that would pass it is left out whole, with one warning
            naming it, and listed in `rec.dropped`. The forward is never stopped.
        device: Where to keep the values (`"cpu"` offloads); `None` keeps them where they are.

    Returns:
        A context manager whose `with` block records; it yields the `Recording`, filled while the block runs and
        kept after it.

    Raises:
        ValueError: `select` matches no module (the closest paths are listed), `at` is not "input"/"output", or
            `max_bytes` is not positive.

    Example:
        >>> import torch, torch.nn as nn
        >>> from hookscope import steer
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> with steer.record(model, "1") as rec:
        ...     _ = model(torch.randn(3, 4))
        >>> rec["1"].shape
        torch.Size([3, 8])
    """
    where = None if device is None else torch.device(device)
    chosen = resolve(model, select, "select")
    return _recording(chosen, Recording([path for path, _ in chosen], at, max_bytes, where))


@contextmanager
def _recording(chosen: list[tuple[str, nn.Module]], recording: Recording) -> Iterator[Recording]:
    # Recording observes: a failure of its hook (an offload that runs out of memory) is counted and warned about,
    # never raised into the user's forward (raised under strict=True / HOOKSCOPE_STRICT=1).
    errors = HookErrors("steer.record()")
    sites = [(path, module, _Keep(recording, path)) for path, module in chosen]
    handles = place_all(sites, recording.at, owner=recording, is_edit=False, errors=errors)
    try:
        yield recording
    finally:
        for handle in reversed(handles):
            handle.remove()


class _Keep:
    """The observing edit of one recorded site: keeps the value, returns `None` (the value passes untouched)."""

    __slots__ = ("path", "recording")

    def __init__(self, recording: Recording, path: str) -> None:
        self.recording = recording
        self.path = path

    def __call__(self, value: torch.Tensor) -> None:
        self.recording._keep(self.path, value)
