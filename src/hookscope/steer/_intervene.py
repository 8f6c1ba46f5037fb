"""Applying interventions: `intervene(model, {site: intervention or [interventions]})` and its handle."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn as nn

from .._check import checked, one_of, shown
from ..hooks import HookHandle
from ._interventions import Intervention
from ._sites import AT, place_all, resolve

__all__ = ["Spec", "Steering", "as_items", "check_width", "intervene", "module_width"]

Spec = Mapping[str, Intervention | Sequence[Intervention]]
"""`{site path or glob: an intervention or a list of them}`."""


class Steering:
    """The handle `intervene` returns: its hooks, by site; `remove()` is idempotent; usable as `with`.

    Attributes:
        at: "input" or "output".
        sites: Site path -> the interventions applied there, in order.
        handles: The registry's handles of the hooks it placed (one per site).
    """

    def __init__(self, at: str, sites: dict[str, tuple[Intervention, ...]]) -> None:
        self.at = at
        self.sites = sites
        self.handles: list[HookHandle] = []

    @property
    def is_removed(self) -> bool:
        """Whether every hook it placed is gone."""
        return all(handle.is_removed for handle in self.handles)

    def remove(self) -> None:
        """Remove the hooks it placed (and only those); calling it again does nothing."""
        for handle in reversed(self.handles):
            handle.remove()

    def __enter__(self) -> Steering:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self.is_removed else "active"
        shown = ", ".join(f"{path!r}: {list(items)!r}" for path, items in list(self.sites.items())[:4])
        more = f", ... {len(self.sites) - 4} more" if len(self.sites) > 4 else ""
        return f"Steering(at={self.at!r}, {{{shown}{more}}}, {state})"


class _Apply:
    """The edit placed on one site: apply its interventions in order; a misfit removes every hook of the handle."""

    __slots__ = ("items", "on_error", "path")

    def __init__(self, items: tuple[Intervention, ...], path: str, on_error: Callable[[], None]) -> None:
        self.items = items
        self.path = path
        self.on_error = on_error

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self._applied(value)
        try:
            return self._applied(value)
        except ValueError:
            self.on_error()  # a site that does not fit: nothing of this intervene stays attached
            raise

    def _applied(self, value: torch.Tensor) -> torch.Tensor:
        for item in self.items:
            value = item.apply(value, self.path)
        return value


@checked(at=one_of(AT))
def intervene(model: nn.Module, interventions: Spec, *, at: str = "output") -> Steering:
    """Apply `interventions` to the sites they name, on every forward, until the handle is removed.

    Keys are module paths or globs (`"blocks.*.attn.out_proj"`), normalized across DDP/compile/FSDP wrappers;
    values are interventions (`Zero`, `Scale`, `Add`, `Replace`, `Mean`, `Clamp`, `Project`) or lists of them,
    applied in order. Gradients flow through every intervention: training with one on is training with the same
    hand-written forward hook. The hooks go through hookscope's registry (`list_hooks()` shows them, tagged
    `steer`) and are prepended, so every other hook on the same module (yours, a `watch()`) sees the steered value;
    of two `intervene` on one site, the later one runs first.

    Nothing is attached unless every site is right: a path that matches nothing raises with the closest paths,
    and, where the module says its width (`nn.Linear`, `nn.Embedding`, `nn.LayerNorm`, HF `Conv1D`), an
    intervention that cannot fit it raises here. A shape that turns out not to fit during a forward raises a
    `ValueError` naming the site, and every hook of the handle is removed.

    A model compiled after `intervene` runs the interventions (torch.compile traces the hooks); added after the
    first compiled call, they run only once torch.compile recompiles (a `CompiledModelWarning` says so), as for
    `watch()`.

    Args:
        model: Any `nn.Module`.
        interventions: `{site: intervention or [interventions]}`.
        at: "output" (the module's output, or its first tensor) or "input" (its first input).

    Returns:
        A `Steering` handle: a context manager, with an idempotent `remove()`.

    Raises:
        TypeError: `interventions` is not a non-empty mapping of str to interventions.
        ValueError: a site matches no module, or an intervention cannot fit a site's known width.

    Example:
        >>> import torch, torch.nn as nn
        >>> from hookscope import steer
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> with steer.intervene(model, {"1": steer.Zero()}):
        ...     out = model(torch.randn(3, 4))
        >>> torch.equal(out, model[2].bias.expand(3, 2))
        True
    """
    if not isinstance(interventions, Mapping) or not interventions:
        raise TypeError(
            f"interventions must be a non-empty dict {{site path: intervention or [interventions]}}, got "
            f"{shown(interventions)}; e.g. {{'blocks.0': steer.Zero()}}"
        )
    plan: dict[str, tuple[nn.Module, list[Intervention]]] = {}
    for key, value in interventions.items():
        if not isinstance(key, str):
            raise TypeError(f"interventions keys must be module paths or globs (str), got {key!r}")
        items = as_items(key, value)
        for path, module in resolve(model, key, "interventions key"):
            plan.setdefault(path, (module, []))[1].extend(items)
    for path, (module, items) in plan.items():
        for item in items:
            check_width(item, module, at, path)
    steering = Steering(at, {path: tuple(items) for path, (_, items) in plan.items()})
    edits = [(path, module, _Apply(steering.sites[path], path, steering.remove)) for path, (module, _) in plan.items()]
    steering.handles = place_all(edits, at, owner=steering, is_edit=True)
    return steering


def as_items(key: str, value: object) -> list[Intervention]:
    items = [value] if isinstance(value, Intervention) else value
    if isinstance(items, (list, tuple)) and items and all(isinstance(i, Intervention) for i in items):
        return list(items)
    raise TypeError(
        f"interventions[{key!r}] must be an intervention (steer.Zero(), steer.Add(vector) ...) or a non-empty list "
        f"of them, got {shown(value)}"
    )


def module_width(module: nn.Module, at: str) -> int | None:
    """The last dimension of `module`'s input or output where the module says it, else `None`."""
    if isinstance(module, nn.Linear):
        return module.in_features if at == "input" else module.out_features
    if isinstance(module, nn.Embedding):
        return None if at == "input" else module.embedding_dim
    if isinstance(module, nn.LayerNorm) and module.normalized_shape:
        return int(module.normalized_shape[-1])
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0] if at == "input" else weight.shape[1])  # HF GPT-2's Conv1D: weight [in, out]
    return None


def check_width(item: Intervention, module: nn.Module, at: str, path: str) -> None:
    """Check `item` against `module`'s width where the module says it, so a misfit raises before anything is placed.

    Raises:
        ValueError: `item` cannot fit a value of that width (heads that do not divide it, a vector of another size).
    """
    width = module_width(module, at)
    if width is not None:
        item.check_width(width, path)
