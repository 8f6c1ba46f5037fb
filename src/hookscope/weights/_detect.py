"""Detectors on weights: broken symmetry, duplicate units, stable rank and spectral norm.

Pairwise checks never build an `(n, n)` matrix: symmetry sorts the rows along their widest column and
compares only neighbours within the threshold; duplicates are found block by block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .._check import aliases, checked
from ..hooks._select import Selector
from ._layers import effective_weight, unit_rows, weight_layers

__all__ = [
    "DuplicateUnits",
    "detect_weight_symmetry_breaking",
    "find_duplicate_units",
    "has_close_rows",
    "spectral_stats",
]

_BLOCK_ELEMENTS = 1 << 22  # entries per temporary block (16 MiB in float32)
_SKETCH_COLUMNS = 16


def _matrix_layers(model: nn.Module, select: Selector) -> list[tuple[str, nn.Module]]:
    return [(path, m) for path, m in weight_layers(model, select) if effective_weight(m).dim() >= 2]


def _working_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def has_close_rows(rows: torch.Tensor, threshold: float) -> bool:
    """Whether two rows of `rows` differ by at most `threshold` in every entry (L-infinity distance).

    Sorts the rows by their widest column: two rows within `threshold` of each other are within `threshold`
    in that column too, so only pairs whose sorted keys are that close are candidates, offset by offset;
    candidates are screened on the next widest columns, then compared in full, in blocks. Memory is
    O(rows + block), never quadratic. Rows with NaN never count as close.

    Shape:
        rows `(n, d)`.
    """
    n = rows.shape[0]
    if n < 2:
        return False
    rows = rows.detach().to(_working_dtype(rows))
    if rows.shape[1] == 0:
        return True
    spread = torch.nan_to_num(rows.amax(0) - rows.amin(0), nan=-1.0)
    widest = torch.topk(spread, min(_SKETCH_COLUMNS, rows.shape[1])).indices
    order = torch.argsort(rows[:, widest[0]], stable=True)
    ordered = rows.index_select(0, order)
    keys, sketch = ordered[:, widest[0]], ordered.index_select(1, widest)
    block = max(1, _BLOCK_ELEMENTS // rows.shape[1])
    for offset in range(1, n):
        candidates = torch.nonzero((keys[offset:] - keys[:-offset]) <= threshold).flatten()
        if candidates.numel() == 0:
            return False  # keys are sorted: gaps only grow with the offset
        # A cheap necessary condition on a few wide columns first, then every column for the survivors.
        near = ((sketch[candidates + offset] - sketch[candidates]).abs() <= threshold).all(dim=1)
        candidates = candidates[near]
        for start in range(0, candidates.numel(), block):
            index = candidates[start : start + block]
            gap = (ordered.index_select(0, index + offset) - ordered.index_select(0, index)).abs().amax(dim=1)
            if bool((gap <= threshold).any()):
                return True
    return False


@checked()
def detect_weight_symmetry_breaking(model: nn.Module, threshold: float = 1e-4) -> dict[str, bool]:
    """Tell, per layer, whether its output units are all different (symmetry broken).

    A unit is a row of the weight viewed as `(out_features, -1)`, with its bias appended where there is one.
    `True`: every pair of units differs by more than `threshold` in at least one entry; `False`: some two
    units are identical within `threshold` (e.g. constant initialization); a layer with one unit is `True`.
    Layers whose weight has fewer than two dimensions (normalization scales, which have no incoming weights
    per unit and start equal by design) are left out. Runs in O(n log n + candidates) time and O(n) memory,
    so 4096-unit layers are fine.

    Raises:
        ValueError: `threshold` is negative or not a number.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
    result = {}
    for path, module in _matrix_layers(model, None):
        bias = getattr(module, "bias", None)
        rows = unit_rows(effective_weight(module), bias if isinstance(bias, torch.Tensor) else None)
        result[path] = not has_close_rows(rows, float(threshold))
    return result


@dataclass
class DuplicateUnits:
    """Pairs of units `(i, j, cosine)` with i < j whose weight rows point the same way; `total` counts all of
    them, `pairs` keeps the first `max_pairs` in row-major order."""

    pairs: list[tuple[int, int, float]] = field(default_factory=list)
    total: int = 0


@aliases(layer_names="select")
@checked()
def find_duplicate_units(
    model: nn.Module, threshold: float = 0.99, select: Selector = None, *, max_pairs: int = 100
) -> dict[str, DuplicateUnits]:
    """Find, per layer, the pairs of output units whose weight rows have a cosine similarity above `threshold`.

    Rows are the weight viewed as `(out_features, -1)` (no bias); all-zero rows have no direction and never
    count. Similarities are computed block by block: memory O(block * n), not O(n^2).

    Raises:
        ValueError: `threshold` is not in [-1, 1), or `max_pairs` is negative.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not -1 <= threshold < 1:
        raise ValueError(f"threshold must be a cosine similarity in [-1, 1), got {threshold!r}")
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 0:
        raise ValueError(f"max_pairs must be an int >= 0, got {max_pairs!r}")
    return {
        path: _duplicates(unit_rows(effective_weight(module)), float(threshold), max_pairs)
        for path, module in _matrix_layers(model, select)
    }


def _duplicates(rows: torch.Tensor, threshold: float, max_pairs: int) -> DuplicateUnits:
    rows = rows.to(_working_dtype(rows))
    norms = torch.linalg.vector_norm(rows, dim=1)
    unit = rows / norms.clamp_min(torch.finfo(rows.dtype).tiny).unsqueeze(1)
    n = rows.shape[0]
    block = max(1, _BLOCK_ELEMENTS // max(n, 1))
    found = DuplicateUnits()
    total = torch.zeros((), dtype=torch.int64, device=rows.device)
    columns = torch.arange(n, device=rows.device)
    for start in range(0, n, block):
        similarity = unit[start : start + block] @ unit.T
        upper = columns.unsqueeze(0) > (columns[start : start + block]).unsqueeze(1)
        hits = (similarity > threshold) & upper & (norms > 0).unsqueeze(0) & (norms[start : start + block] > 0)[:, None]
        total += hits.sum()
        if len(found.pairs) < max_pairs:
            for i, j in torch.nonzero(hits)[: max_pairs - len(found.pairs)].tolist():
                found.pairs.append((start + i, j, float(similarity[i, j])))
    found.total = int(total)
    return found


@aliases(layer_names="select")
@checked()
def spectral_stats(
    model: nn.Module, select: Selector = None, *, power_iterations: int | None = None
) -> dict[str, dict[str, float]]:
    """Return, per layer, `spectral_norm` (largest singular value), `frobenius_norm` and `stable_rank`
    (||W||_F^2 / ||W||_2^2, 0.0 for a zero weight) of the weight viewed as `(out_features, -1)`.

    `power_iterations=None` computes the spectral norm exactly (singular values); an int runs that many power
    iterations from a fixed start instead (a lower bound that converges, much cheaper on large layers).
    Layers whose weight has fewer than two dimensions are left out.

    Raises:
        ValueError: `power_iterations` is not None or a positive int.
    """
    if power_iterations is not None and (
        isinstance(power_iterations, bool) or not isinstance(power_iterations, int) or power_iterations < 1
    ):
        raise ValueError(f"power_iterations must be None or an int >= 1, got {power_iterations!r}")
    result = {}
    for path, module in _matrix_layers(model, select):
        matrix = unit_rows(effective_weight(module))
        matrix = matrix.to(_working_dtype(matrix))
        spectral = _spectral_norm(matrix, power_iterations)
        frobenius = torch.linalg.vector_norm(matrix)
        safe = torch.where(spectral > 0, spectral, torch.ones_like(spectral))
        stable = torch.where(spectral > 0, (frobenius / safe) ** 2, torch.zeros_like(spectral))
        values = torch.stack([spectral, frobenius, stable]).tolist()
        result[path] = dict(zip(("spectral_norm", "frobenius_norm", "stable_rank"), values, strict=True))
    return result


def _spectral_norm(matrix: torch.Tensor, iterations: int | None) -> torch.Tensor:
    if iterations is None:
        exact: torch.Tensor = torch.linalg.matrix_norm(matrix, ord=2)
        return exact
    generator = torch.Generator(device=matrix.device).manual_seed(0)
    vector = torch.randn(matrix.shape[1], generator=generator, dtype=matrix.dtype, device=matrix.device)
    for _ in range(iterations):
        vector = matrix.T @ (matrix @ vector)
        vector = vector / torch.linalg.vector_norm(vector).clamp_min(torch.finfo(matrix.dtype).tiny)
    estimate: torch.Tensor = torch.linalg.vector_norm(matrix @ vector)
    return estimate
