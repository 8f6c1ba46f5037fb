"""Statistics across torch.distributed ranks: exact merges, every rank in every collective, with a timeout.

Every merge combines the engine's records (`hookscope.stats`): means and deviations by Chan's formulas (never by
averaging per-rank means), norms of shards as the root of summed squares, counts summed, minima and maxima by
min/max, histograms re-binned exactly to the widest range of any rank and summed. Keys are
unioned across ranks before any collective (a rank that recorded nothing, or other layers, still joins with
zeros), and collectives run on a gloo group of their own with a timeout, so a missing rank fails loudly instead
of hanging (the group of a timeout is made on its first use, itself a collective: pass the same timeout on
every rank). Outside a distributed run every function returns its input merged with nothing.

`merge_parts` is the one sequence every merge follows (header -> common layout -> each rank's tables aligned to
it -> one collective per table -> assembly), a collective (every rank calls it); `combine_parts` runs the same
sequence over parts held in this process (saved per-rank files). The names follow one rule: `merge_*` is a
collective across ranks (every rank calls it and gets the merged object), `combine*` folds parts held in this
process and returns a new object, its inputs unchanged. The merges and combines of `WatchResults` and
`ActivationStats` are written on them. Also here: `grad_reduction` (the label saying whether parameter gradients
were seen before or after DDP's all-reduce, or as FSDP2 shards), `grad_norms` (full gradient norms of a DDP or
FSDP2 model) and `check_replicas` (which parameters differ across ranks).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn

from ._check import NON_NEGATIVE, TIMEOUT, Want, checked, one_of
from ._errors import MergeWarning
from .hooks import normalize_path
from .reducers._stats import StatsReducer
from .stats._dtensor import is_sharded as sharded_dtensor
from .stats._dtensor import local_part
from .stats._norms import NORM, combine_norm_segments, norm_of, root_sum_squares
from .stats._record import RECORD, combine_segments

__all__ = [
    "DEFAULT_TIMEOUT",
    "GRAD_AFTER_ALL_REDUCE",
    "GRAD_LOCAL",
    "GRAD_SHARDED",
    "MergeWarning",
    "all_gather",
    "all_reduce",
    "check_replicas",
    "gather_objects",
    "grad_norms",
    "grad_reduction",
    "is_distributed",
    "is_main_process",
    "is_sharded",
    "merge_records",
    "merge_stats_reducer",
    "norm_of_shards",
    "rank",
    "union_keys",
    "world_size",
]

DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)
GRAD_AFTER_ALL_REDUCE = "after all-reduce (DDP)"
"""Parameter gradients read at `optimizer.step()` of a DDP model: averaged over ranks, the same on every rank."""
GRAD_LOCAL = "local (not reduced)"
"""Parameter gradients of this rank alone (no wrapper, `no_sync()`, or read right after backward, before DDP
has written the averaged gradients back)."""
GRAD_SHARDED = "sharded, combined as root sum of squares"
"""FSDP2 (DTensor) parameters: each rank holds a shard of the averaged gradient; full norms are the square root
of the ranks' summed squares."""

_GROUPS: dict[float, tuple[weakref.ref[Any], weakref.ref[Any]]] = {}
"""timeout -> (default group, hookscope's gloo group), both held weakly: torch's registry owns them."""


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
    """A gloo group over all ranks with `timeout`, made once per (world, timeout); every rank creates it alike.

    The groups are held by weak references: torch's registry owns them, so `dist.destroy_process_group()` frees
    them then and there, as every other group. Holding them here kept each rank's destroyed gloo group (and the
    default group) alive until interpreter teardown, where destroying a gloo process group could abort a rank
    at exit ("terminate called without an active exception", tests/distributed/test_ddp_example.py).
    """
    key, world = timeout.total_seconds(), dist.group.WORLD
    known = _GROUPS.get(key)
    group = None if known is None or known[0]() is not world else known[1]()
    if group is None:  # none yet, or the default group was destroyed (and maybe initialized again)
        group = dist.new_group(backend="gloo", timeout=timeout)
        _GROUPS[key] = (weakref.ref(world), weakref.ref(group))
    return group


@contextlib.contextmanager
def _joined(collective: str, timeout: datetime.timedelta) -> Iterator[None]:
    """Re-raise a failed collective (a rank missing past `timeout`, or a rank gone) with what to check."""
    try:
        yield
    except RuntimeError as err:
        raise RuntimeError(
            f"{collective} failed on rank {rank()}: not every rank joined within {timeout.total_seconds():g} s, or "
            f"a rank failed. Every rank must call hookscope's merges, also ranks that recorded nothing. ({err})"
        ) from err


@checked(timeout=TIMEOUT)
def gather_objects(value: Any, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> list[Any]:
    """Every rank's `value` (picklable, small), in rank order; `[value]` outside a distributed run."""
    if not is_distributed():
        return [value]
    gathered: list[Any] = [None] * world_size()
    with _joined("all_gather_object", timeout):
        dist.all_gather_object(gathered, value, group=_group(timeout))
    return gathered


@checked(timeout=TIMEOUT)
def union_keys(keys: Iterable[str], *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> list[str]:
    """The union of every rank's keys, in first-seen order over ranks 0, 1, ...; the same list on every rank."""
    gathered = gather_objects(list(dict.fromkeys(keys)), timeout=timeout)
    return list(dict.fromkeys(key for keys_of_rank in gathered for key in (keys_of_rank or [])))


@checked(op=one_of(("sum", "min", "max")), timeout=TIMEOUT)
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
    work = _padded(tensor)
    with _joined("all_reduce", timeout):
        dist.all_reduce(work, op=ops[op], group=_group(timeout))
    return work[: tensor.numel()].reshape(tensor.shape).to(tensor.device)


@checked(timeout=TIMEOUT)
def all_gather(tensor: torch.Tensor, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> list[torch.Tensor]:
    """Every rank's `tensor` (one shape and dtype on all ranks, empty allowed), in rank order, on its device."""
    if not is_distributed():
        return [tensor.clone()]
    work = _padded(tensor)
    parts = [torch.empty_like(work) for _ in range(world_size())]
    with _joined("all_gather", timeout):
        dist.all_gather(parts, work, group=_group(timeout))
    return [part[: tensor.numel()].reshape(tensor.shape).to(tensor.device) for part in parts]


def _padded(tensor: torch.Tensor) -> torch.Tensor:
    """A flat CPU copy with at least one element (gloo refuses empty tensors)."""
    flat = tensor.detach().reshape(-1).to("cpu", copy=True)
    return flat if flat.numel() else torch.zeros(1, dtype=flat.dtype)


@checked(timeout=TIMEOUT)
def norm_of_shards(local_square_sum: torch.Tensor, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> torch.Tensor:
    """The L2 norm of a tensor sharded over ranks, from each rank's sum of squares of its shard."""
    norms = torch.stack(all_gather(local_square_sum.double().sqrt(), timeout=timeout))  # (ranks, ...)
    return root_sum_squares(norms, dim=0)


_RECORDS = Want(
    lambda v: not isinstance(v, torch.Tensor) or (v.dim() >= 1 and v.shape[-1] == len(RECORD)),
    f"moments records: {len(RECORD)} columns (hookscope.stats.RECORD) in the last dim",
)


@checked(records=_RECORDS, timeout=TIMEOUT)
def merge_records(records: torch.Tensor, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> torch.Tensor:
    """Merge moments records (`hookscope.stats.RECORD` in the last dim) over ranks, the same on every rank.

    A collective: all ranks pass records of one shape (union the keys first and pass empty records where nothing
    was seen). Outside a distributed run the records are returned as they are.
    """
    stacked = torch.stack(all_gather(records.double(), timeout=timeout))
    return combine_ranks(stacked)


def combine_ranks(stacked: torch.Tensor) -> torch.Tensor:
    """Combine (ranks, ..., len(RECORD)) records over the first dimension: one `combine_segments` call."""
    ranks, width = stacked.shape[0], stacked.shape[-1]
    cells = stacked[0].numel() // width
    segment = torch.arange(cells).repeat(ranks)
    merged = combine_segments(stacked.reshape(ranks * cells, width), segment, cells)
    return merged.reshape(stacked.shape[1:])


Header = TypeVar("Header")
Layout = TypeVar("Layout")
Result = TypeVar("Result")
Part = TypeVar("Part")


def reduce_tables(
    tables: dict[str, torch.Tensor] | Sequence[dict[str, torch.Tensor]],
    ops: dict[str, str],
    *,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> dict[str, torch.Tensor]:
    """Reduce tables over ranks by name: `"gather"` stacks them in rank order (a new first dim), `"sum"`, `"max"`
    and `"min"` reduce elementwise.

    Give this rank's tables (a dict: a collective, every rank calls it with tables of the same names and shapes)
    or every rank's (a sequence of dicts, rank 0 first: no collective).
    """
    if isinstance(tables, dict):
        return {
            name: torch.stack(all_gather(t, timeout=timeout))
            if ops[name] == "gather"
            else all_reduce(t, ops[name], timeout=timeout)
            for name, t in tables.items()
        }
    out = {}
    for name in tables[0]:
        stacked = torch.stack([part[name] for part in tables])
        op = ops[name]
        out[name] = (
            stacked
            if op == "gather"
            else stacked.sum(0)
            if op == "sum"
            else stacked.amax(0)
            if op == "max"
            else stacked.amin(0)
        )
    return out


def merge_parts(
    own: Part,
    *,
    header: Callable[[Part], Header],
    layout: Callable[[list[Header]], Layout],
    pack: Callable[[Part, Header, Layout], dict[str, torch.Tensor]],
    ops: dict[str, str],
    assemble: Callable[[list[Header], Layout, dict[str, torch.Tensor]], Result],
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> Result:
    """Merge this rank's part `own` with every other rank's, in the one sequence every merge follows.

    A collective: every rank calls it and gets the same result. Each part is described by a small picklable
    `header`; the headers of every rank give the common `layout` (the union of keys and steps, the widest
    histogram ranges ...); each part is packed into tables aligned to it; the tables are reduced over ranks
    (`reduce_tables` with `ops`); `assemble` builds the result.
    """
    headers = gather_objects(header(own), timeout=timeout)
    common = layout(headers)
    tables = reduce_tables(pack(own, headers[rank()] if is_distributed() else headers[0], common), ops, timeout=timeout)
    return assemble(headers, common, tables)


def combine_parts(
    parts: Sequence[Part],
    *,
    header: Callable[[Part], Header],
    layout: Callable[[list[Header]], Layout],
    pack: Callable[[Part, Header, Layout], dict[str, torch.Tensor]],
    ops: dict[str, str],
    assemble: Callable[[list[Header], Layout, dict[str, torch.Tensor]], Result],
) -> Result:
    """Combine parts held in this process (every rank's, rank 0 first) as `merge_parts` merges ranks' parts.

    No collective; the parts are read, never changed.

    Raises:
        ValueError: `parts` is empty.
    """
    if not parts:
        raise ValueError("parts must hold at least one part to combine, got none")
    headers = [header(part) for part in parts]
    common = layout(headers)
    tables = reduce_tables([pack(part, h, common) for part, h in zip(parts, headers, strict=True)], ops)
    return assemble(headers, common, tables)


@checked(timeout=TIMEOUT)
def merge_stats_reducer(reducer: StatsReducer, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> StatsReducer:
    """Merge every rank's `StatsReducer` into a new one on the CPU (Chan's formulas, in rank order).

    A collective: every rank must call it (also with a reducer that saw nothing) and gets the same result.

    Raises:
        TypeError: `reducer` is not a `StatsReducer`.
    """
    if not isinstance(reducer, StatsReducer):
        raise TypeError(f"reducer must be a StatsReducer, got {type(reducer).__name__}")
    state = reducer.state_dict()
    state["state"] = {name: tensor.detach().cpu() for name, tensor in state["state"].items()}
    merged = StatsReducer(**reducer.config())
    for theirs in gather_objects(state, timeout=timeout):
        part = StatsReducer(**theirs["config"])
        part.load_state_dict(theirs)
        merged = merged.combine(part)
    return merged


# ---- gradients and parameters of wrapped models -------------------------------------------------------------


@checked()
def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a DTensor with a sharded placement (an FSDP2 parameter or gradient)."""
    return sharded_dtensor(tensor)


@checked()
def grad_reduction(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str:
    """Say what the parameter gradients of `model` are when a watch reads them (`meta["grad_reduction"]`).

    `GRAD_SHARDED` for FSDP2 models (DTensor parameters), `GRAD_AFTER_ALL_REDUCE` for a DDP-wrapped model read at
    `optimizer.step()` (the optimizer is given), `GRAD_LOCAL` otherwise: without an optimizer the gradients are
    read when backward ends, before DDP writes the averaged gradients back, and a model wrapped only after the
    watch was attached is seen as unwrapped (merging across ranks checks the values and says what it found).
    """
    if any(is_sharded(p) for p in model.parameters()):
        return GRAD_SHARDED
    wrapped = isinstance(model, nn.parallel.DistributedDataParallel)
    return GRAD_AFTER_ALL_REDUCE if wrapped and optimizer is not None else GRAD_LOCAL


@checked(timeout=TIMEOUT)
def grad_norms(
    model: nn.Module, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT
) -> dict[str, dict[str, torch.Tensor]]:
    """Return the norm of every parameter's full gradient, by normalized name, the same on every rank.

    The norm is watch()'s (`hookscope.stats.norm_of`): `"norm"`, the L2 norm of the finite values, and
    `"nonfinite"`, the count of NaN/Inf values, as in `WatchResults.param_grads[name]` (a gradient holding a NaN
    keeps its norm and says it held one). A collective: every rank must call it. Sharded (FSDP2) gradients combine
    over ranks (root of summed squares, counts summed); other gradients are taken from the lowest rank that has
    one (after DDP's all-reduce they are the same everywhere). Parameters without a gradient on any rank are left
    out. 0-d float64 tensors, on the CPU.
    """
    local: dict[str, tuple[bool, torch.Tensor]] = {}
    for name, param in model.named_parameters():
        if param.grad is not None:
            local[normalize_path(name)] = (sharded_dtensor(param.grad), norm_of(local_part(param.grad)).cpu())
    names = union_keys(local, timeout=timeout)
    absent = torch.full((len(NORM),), math.nan, dtype=torch.float64)
    packed = torch.stack([local[n][1] if n in local else absent for n in names]) if names else absent[None, :0]
    flags = torch.tensor([local[n][0] if n in local else False for n in names], dtype=torch.float64)
    sharded = all_reduce(flags, "max", timeout=timeout)
    stacked = torch.stack(all_gather(packed, timeout=timeout))  # (ranks, names, len(NORM))
    out = {}
    for j, name in enumerate(names):
        records = stacked[:, j]
        seen = records[~records[:, 2].isnan()]
        if len(seen):
            merged = combine_norm_segments(seen, torch.zeros(len(seen), dtype=torch.int64), 1)[0]
            record = merged if sharded[j] > 0 else seen[0]
            out[name] = {"norm": record[0].clone(), "nonfinite": record[1].clone()}
    return out


@checked(rtol=NON_NEGATIVE, atol=NON_NEGATIVE, timeout=TIMEOUT)
def check_replicas(
    model: nn.Module,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> list[str]:
    """Return the normalized names of parameters and buffers that differ across ranks (`[]`: all replicas agree).

    A collective: every rank must call it and gets the same list. Each rank compares its values with rank 0's
    (`torch.isclose` with `rtol`/`atol`, NaNs equal); a name missing or shaped differently on some rank counts as
    different. Sharded (FSDP2) tensors are not replicas and are skipped.
    """
    tensors = {
        normalize_path(name): t.detach()
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if not is_sharded(t)
    }
    shapes = gather_objects({name: tuple(t.shape) for name, t in tensors.items()}, timeout=timeout)
    names = list(dict.fromkeys(name for table in shapes for name in table))
    common = [n for n in names if all(table.get(n) == shapes[0].get(n) for table in shapes) and n in shapes[0]]
    flat = torch.cat([tensors[n].reshape(-1).double().cpu() for n in common]) if common else torch.zeros(0)
    reference = _padded(flat.double())
    if is_distributed():
        with _joined("broadcast", timeout):
            dist.broadcast(reference, src=0, group=_group(timeout))
    differs, start = [], 0
    for name in common:
        size = tensors[name].numel()
        mine, theirs = flat[start : start + size], reference[start : start + size]
        differs.append(not bool(torch.isclose(mine, theirs, rtol=rtol, atol=atol, equal_nan=True).all()))
        start += size
    flags = all_reduce(torch.tensor(differs, dtype=torch.float64), "max", timeout=timeout)
    bad = {n for n, flag in zip(common, flags.tolist(), strict=True) if flag > 0}
    return [n for n in names if n in bad or n not in common]
