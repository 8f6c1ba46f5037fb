"""Statistics across torch.distributed ranks: exact merges, every rank in every collective, with a timeout.

Means and variances merge by Chan's parallel formulas (never by averaging per-rank means), norms of shards as
the square root of summed squares, counts and histograms by summing, minima and maxima by min/max. Keys are
unioned across ranks before any collective (a rank that recorded nothing, or other layers, still joins with
zeros), and collectives run on a gloo group of their own with a timeout, so a missing rank fails loudly instead
of hanging. Outside a distributed run every function returns its input merged with nothing.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DEFAULT_TIMEOUT",
    "all_reduce",
    "chan_merge",
    "is_distributed",
    "is_main_process",
    "merge_moments",
    "norm_of_shards",
    "rank",
    "union_keys",
    "world_size",
]

DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)
_GROUPS: dict[tuple[int, float], Any] = {}


def is_distributed() -> bool:
    """Whether torch.distributed is initialized with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 outside a distributed run)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """The number of ranks (1 outside a distributed run)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """Whether this process writes reports and files (rank 0, or not distributed)."""
    return rank() == 0


def _group(timeout: datetime.timedelta) -> Any:
    """A gloo group over all ranks with `timeout`, made once per (world, timeout); every rank creates it alike."""
    key = (id(dist.group.WORLD), timeout.total_seconds())
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(backend="gloo", timeout=timeout)
    return _GROUPS[key]


def union_keys(keys: Iterable[str], *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> list[str]:
    """The union of every rank's keys, in first-seen order over ranks 0, 1, ...; the same list on every rank."""
    mine = list(dict.fromkeys(keys))
    if not is_distributed():
        return mine
    gathered: list[list[str] | None] = [None] * world_size()
    dist.all_gather_object(gathered, mine, group=_group(timeout))
    return list(dict.fromkeys(key for keys_of_rank in gathered for key in (keys_of_rank or [])))


def all_reduce(tensor: torch.Tensor, op: str = "sum", *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> torch.Tensor:
    """Reduce `tensor` over ranks with `op` (`"sum"`, `"min"` or `"max"`); returns a new tensor on its device.

    Raises:
        ValueError: `op` is not one of the three.
    """
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    if op not in ops:
        raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
    if not is_distributed():
        return tensor.clone()
    work = tensor.detach().to("cpu", copy=True)
    dist.all_reduce(work, op=ops[op], group=_group(timeout))
    return work.to(tensor.device)


def norm_of_shards(local_square_sum: torch.Tensor, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> torch.Tensor:
    """The L2 norm of a tensor sharded over ranks, from each rank's sum of squares of its shard."""
    return all_reduce(local_square_sum.double(), "sum", timeout=timeout).sqrt()


def chan_merge(
    a: tuple[torch.Tensor, torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge two `(count, mean, m2)` summaries by Chan's formulas; elementwise, zero counts allowed.

    `m2` is the sum of squared deviations from the mean (variance = m2 / (count - 1)).
    """
    count_a, mean_a, m2_a = a
    count_b, mean_b, m2_b = b
    count = count_a + count_b
    safe = torch.where(count > 0, count, torch.ones_like(count))
    delta = mean_b - mean_a
    mean = torch.where(count > 0, mean_a + delta * (count_b / safe), torch.zeros_like(mean_a))
    m2 = m2_a + m2_b + delta.square() * (count_a * count_b / safe)
    return count, mean, torch.where(count > 0, m2, torch.zeros_like(m2))


def merge_moments(
    count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge `(count, mean, m2)` over ranks by Chan's formulas in rank order, in float64; the same on every rank.

    All ranks must pass tensors of one shape (union the keys first and pass zero counts where nothing was seen).
    """
    stacked = torch.stack([count.double(), mean.double(), m2.double()])
    if not is_distributed():
        return stacked[0], stacked[1], stacked[2]
    work = stacked.to("cpu")
    parts = [torch.empty_like(work) for _ in range(world_size())]
    dist.all_gather(parts, work, group=_group(timeout))
    merged = (parts[0][0], parts[0][1], parts[0][2])
    for part in parts[1:]:
        merged = chan_merge(merged, (part[0], part[1], part[2]))
    return tuple(t.to(count.device) for t in merged)  # type: ignore[return-value]
