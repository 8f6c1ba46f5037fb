"""Independent references for patching: one forward per cell, each patched with `intervene` and a `Replace` of
the clean run's value (itself checked bitwise against forwards edited by hand), normalised in float64."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from hookscope import steer


def call(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def loop_of_interventions(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Callable[[Any], torch.Tensor],
    sites: list[str],
    *,
    positions: list[int] | None,
    heads: list[int] | None = None,
    n_heads: int = 1,
    at: str = "output",
) -> torch.Tensor:
    """`[sites, cells]` normalised recoveries, cells positions first then heads, as `steer.patch` orders them."""
    with torch.no_grad(), steer.record(model, sites, at=at) as rec:
        clean_metric = metric(call(model, clean)).double()
    with torch.no_grad():
        corrupted_metric = metric(call(model, corrupted)).double()
    rows = []
    for site in sites:
        value = rec.calls(site)[0]
        width = value.shape[-1] // n_heads
        row = []
        for position in positions if positions is not None else [None]:
            for head in heads if heads is not None else [None]:
                piece = value if position is None else value[:, position]
                if head is not None:
                    piece = piece[..., head * width : (head + 1) * width]
                spec = steer.Replace(
                    piece, positions=position, heads=head, n_heads=n_heads if head is not None else None
                )
                with torch.no_grad(), steer.intervene(model, {site: spec}, at=at):
                    row.append(metric(call(model, corrupted)).double())
        rows.append(torch.stack(row))
    return (torch.stack(rows) - corrupted_metric) / (clean_metric - corrupted_metric)
