"""A naive reference recorder: plain torch hooks, full tensors, statistics computed in float64 by hand.

It fills `WatchResults` the slow obvious way, so the doctor's checks can be tested before and independently of
`watch()`: every figure a check reads comes from here, never from hookscope's own collectors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

from hookscope.results import WatchResults

Batch = tuple[torch.Tensor, torch.Tensor]
_BOUNDS = {"Tanh": (-1.0, 1.0), "Sigmoid": (0.0, 1.0), "Hardtanh": (-1.0, 1.0), "Softsign": (-1.0, 1.0)}


def _units_view(x: torch.Tensor) -> torch.Tensor:
    """(units, values): dim 1 of 4-D outputs, the last dim otherwise."""
    if x.dim() == 4:
        return x.transpose(0, 1).reshape(x.shape[1], -1)
    return x.reshape(-1, x.shape[-1]).t()


class _Recorder:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.paths = {m: p for p, m in model.named_modules() if p and not list(m.children())}
        self.rows: list[dict[str, dict[str, float]]] = []
        self.grads: list[dict[str, dict[str, float]]] = []
        self.active: dict[str, torch.Tensor] = {}
        self.seen: dict[str, torch.Tensor] = {}
        self.first: dict[str, Any] = {"forward": None, "backward": None}
        self.step = 0

    def forward_hook(self, module: nn.Module, args: Any, out: torch.Tensor) -> None:
        path = self.paths[module]
        x = out.detach().double()
        finite = x[torch.isfinite(x)]
        stats = {
            "mean": finite.mean().item(),
            "std": finite.std().item() if finite.numel() > 1 else float("nan"),
            "rms": finite.pow(2).mean().sqrt().item(),
            "min": finite.min().item() if finite.numel() else float("nan"),
            "max": finite.max().item() if finite.numel() else float("nan"),
            "near_zero": (x.abs() <= 0.05).double().mean().item(),
            "nonfinite": float((~torch.isfinite(x)).sum().item()),
            "saturated": float("nan"),
        }
        bounds = _BOUNDS.get(type(module).__name__)
        if bounds is not None:
            span = bounds[1] - bounds[0]
            near = (x <= bounds[0] + 0.01 * span) | (x >= bounds[1] - 0.01 * span)
            stats["saturated"] = near.double().mean().item()
        self.rows[-1][path] = stats
        if stats["nonfinite"] and self.first["forward"] is None:
            self.first["forward"] = {"path": path, "step": self.step}
        units = _units_view(x)
        self.active[path] = self.active.get(path, 0) + (units > 0).double().sum(1)
        self.seen[path] = self.seen.get(path, 0) + units.shape[1]
        if out.requires_grad:
            out.register_hook(lambda g, path=path: self.grad_hook(path, g))

    def grad_hook(self, path: str, grad: torch.Tensor) -> None:
        g = grad.detach().double()
        bad = float((~torch.isfinite(g)).sum().item())
        self.grads[-1][path] = {"norm": g.norm().item(), "nonfinite": bad}
        if bad and self.first["backward"] is None:
            self.first["backward"] = {"path": path, "step": self.step}


def _identical_units(module: nn.Module) -> int | None:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
        return None
    rows = weight.detach().double().reshape(weight.shape[0], -1)
    bias = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor):
        rows = torch.cat([rows, bias.detach().double()[:, None]], 1)
    close = (rows[:, None, :] - rows[None, :, :]).abs().amax(-1) <= 1e-6
    close.fill_diagonal_(False)
    return int(close.any(1).sum().item())


def _series(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def record(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    batches: Iterator[Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: int,
) -> WatchResults:
    """Train `steps` steps with plain hooks on every leaf module and return the naive `WatchResults`."""
    rec = _Recorder(model)
    handles = [m.register_forward_hook(rec.forward_hook) for m in rec.paths]
    params = dict(model.named_parameters())
    pgrads: dict[str, dict[str, list[float]]] = {n: {"norm": [], "nonfinite": []} for n in params}
    ratios: dict[str, list[float]] = {n: [] for n in params}
    losses = []
    try:
        for step in range(steps):
            rec.step = step
            rec.rows.append({})
            rec.grads.append({})
            x, y = next(batches)
            loss = loss_fn(model(x), y)
            losses.append(loss.item())
            if optimizer is not None:
                optimizer.zero_grad()
            loss.backward()
            for name, p in params.items():
                g = p.grad.detach().double() if p.grad is not None else None
                pgrads[name]["norm"].append(g.norm().item() if g is not None else float("nan"))
                pgrads[name]["nonfinite"].append(float((~torch.isfinite(g)).sum()) if g is not None else float("nan"))
            before = {n: p.detach().clone().double() for n, p in params.items()}
            if optimizer is not None:
                optimizer.step()
            for name, p in params.items():
                after = p.detach().double()
                ratios[name].append(((after - before[name]).norm() / after.norm()).item())
    finally:
        for handle in handles:
            handle.remove()
    return _build(rec, pgrads, ratios if optimizer is not None else {}, losses)


def _build(
    rec: _Recorder, pgrads: dict[str, dict[str, list[float]]], ratios: dict[str, list[float]], losses: list[float]
) -> WatchResults:
    nan = float("nan")
    layers = {p: type(m).__name__ for m, p in rec.paths.items()}
    activations = {
        p: {s: _series([row.get(p, {}).get(s, nan) for row in rec.rows]) for s in rec.rows[0].get(p, {})}
        for p in layers
        if p in rec.rows[0]
    }
    output_grads = {
        p: {s: _series([row.get(p, {}).get(s, nan) for row in rec.grads]) for s in ("norm", "nonfinite")}
        for p in layers
        if any(p in row for row in rec.grads)
    }
    identical = {p: n for m, p in rec.paths.items() if (n := _identical_units(m)) is not None}
    return WatchResults(
        steps=torch.arange(len(rec.rows), dtype=torch.int64),
        layers=layers,
        activations=activations,
        output_grads=output_grads,
        param_grads={n: {s: _series(v) for s, v in stats.items()} for n, stats in pgrads.items()},
        update_ratios={n: _series(v) for n, v in ratios.items()},
        losses=_series(losses),
        unit_activity={p: (rec.active[p] / rec.seen[p]).float() for p in rec.active},
        identical_units=identical,
        first_nonfinite=rec.first,
    )


def regression_batches(inputs: int = 8, outputs: int = 1, batch: int = 64, seed: int = 0) -> Iterator[Batch]:
    """Yield endless batches of a learnable smooth regression task (a fixed random 2-layer teacher)."""
    gen = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(inputs, 16, generator=gen), torch.randn(16, outputs, generator=gen) / 4
    while True:
        x = torch.randn(batch, inputs, generator=gen)
        yield x, torch.tanh(x @ w1 / inputs**0.5) @ w2


def mlp(inputs: int = 8, width: int = 32, depth: int = 2, activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """`depth` blocks of Linear + activation, then a Linear to one output (paths "0", "1", ... in order)."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(inputs if i == 0 else width, width), activation()]
    layers.append(nn.Linear(width if depth else inputs, 1))
    return nn.Sequential(*layers)


def train(model: nn.Module, steps: int = 20, lr: float = 1e-3, optimizer: str = "adam") -> WatchResults:
    """Train `model` on the regression task with Adam (or SGD) for `steps` steps and record it naively."""
    make = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    return record(model, make(model.parameters(), lr=lr), regression_batches(), nn.functional.mse_loss, steps)
