"""Steering vectors: the mean activation on positive inputs minus the mean on negative ones, per site."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .._check import checked, one_of
from ..hooks._select import Selector
from ._record import record
from ._sites import AT, run_model

__all__ = ["steering_vector"]

METHODS = ("mean_diff", "pca")


@checked(at=one_of(AT), method=one_of(METHODS))
def steering_vector(
    model: nn.Module,
    positive: Any,
    negative: Any,
    *,
    select: Selector,
    at: str = "output",
    position: int = -1,
    method: str = "mean_diff",
) -> dict[str, torch.Tensor]:
    """Return `{site: vector}`: the direction from the negative inputs' activations to the positive ones'.

    `"mean_diff"`: the mean activation at `position` over the positive inputs minus the mean over the negative
    ones. `"pca"`: the first principal direction of the paired differences `positive[i] - negative[i]` (they must
    be as many), pointing along the mean difference and as long as the mean difference's component along it.
    Apply one with `steer.Add(vector, scale=...)`. The model runs without gradients, in its current mode.

    Args:
        model: Any `nn.Module`.
        positive: Model inputs (a tensor, a tuple of arguments or a dict of keyword arguments), a batch of prompts.
        negative: Model inputs of the same form.
        select: The sites, in the one selector language.
        at: "output" or "input".
        position: The position along dim 1 whose activation is read (`-1`: the last; mind left padding).
        method: "mean_diff" or "pca".

    Returns:
        Site path -> a vector of the site's last dimension (on the site's device, its dtype).

    Raises:
        ValueError: `method` is unknown, `position` is out of range, or `"pca"` gets unpaired inputs.
    """
    positives = _activations(model, positive, select, at, position)
    negatives = _activations(model, negative, select, at, position)
    vectors = {}
    for path, good in positives.items():
        bad = negatives[path]
        vectors[path] = _mean_diff(good, bad) if method == "mean_diff" else _pca(path, good, bad)
    return vectors


def _activations(model: nn.Module, inputs: Any, select: Selector, at: str, position: int) -> dict[str, torch.Tensor]:
    with torch.no_grad(), record(model, select, at=at) as rec:
        run_model(model, inputs)
    out = {}
    for path in rec.sites:
        value = rec[path]
        if value.dim() < 3 or not -value.shape[1] <= position < value.shape[1]:
            raise ValueError(
                f"position must index dim 1 of site {path!r}'s value of shape {tuple(value.shape)}, got {position}"
            )
        out[path] = value[:, position].flatten(1)  # [inputs, features]
    return out


def _mean_diff(good: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    return (good.double().mean(0) - bad.double().mean(0)).to(good.dtype)


def _pca(path: str, good: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    if good.shape != bad.shape:
        raise ValueError(
            f"method='pca' needs as many positive as negative inputs (paired), got {good.shape[0]} and {bad.shape[0]} "
            f"at site {path!r}"
        )
    differences = (good - bad).double()
    mean = differences.mean(0)
    direction: torch.Tensor = torch.linalg.svd(differences, full_matrices=False).Vh[0]
    along = torch.dot(mean, direction)
    vector: torch.Tensor = (direction * along).to(good.dtype)
    return vector  # sign and length from the mean difference
