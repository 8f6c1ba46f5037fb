"""Per-head statistics of one attention computation, and of one residual-stream tensor, on the device.

`describe_attention(scores, probs)` reads the pre-softmax logits as the softmax sees them (masked keys at -inf or
at the dtype's lowest values, as Hugging Face masks) and the attention weights, and returns, per head, the
accumulators `ATTENTION_FIELDS` that add up across calls of one step (`finish_attention` turns them into the
statistics `hookscope.results.ATTENTION_STATS`). `attention_scores` forms the logits of a
`scaled_dot_product_attention` call the way it does. `attention_slice` bounds the work: at most
`ATTENTION_VALUES` logits are read per call (whole batch rows first, then every k-th query), and the queries left
out are counted, so the max logit of a sampled call is known to be a lower bound. `describe_residual` gives the
largest magnitude of a hidden state with its channel and token, and its median magnitude. Nothing here reads a
device value back to the host.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "ATTENTION_FIELDS",
    "ATTENTION_VALUES",
    "RESIDUAL_SAMPLE",
    "attention_scores",
    "attention_slice",
    "describe_attention",
    "describe_residual",
    "finish_attention",
]

ATTENTION_FIELDS = ("max_logit", "entropy_sum", "entropy_count", "sink_sum", "queries", "left_out")
"""Per head, what one attention call adds to its step: the largest allowed logit (combined by max), the sum of
the normalised entropies of the queries with at least two keys and their count, the sum of the first key's
attention share over queries with at least one key and their count, and the queries left out by sampling."""

ATTENTION_VALUES = 1 << 17
"""The most logits one attention call reads (whole batch rows first, then every k-th query of one row): 131072,
two sequences of 128 tokens and 4 heads, which keeps the measurement within a few percent of a training step."""

RESIDUAL_SAMPLE = 8192
"""The most values the median magnitude of a hidden state is estimated from (a strided sample)."""


def attention_slice(batch: int, heads: int, queries: int, keys: int) -> tuple[int, int]:
    """`(rows, stride)`: read the first `rows` batch rows and every `stride`-th query, at most `ATTENTION_VALUES`
    logits in all."""
    per_row = max(heads * queries * keys, 1)
    rows = max(min(batch, ATTENTION_VALUES // per_row), 1)
    stride = max(math.ceil(per_row / ATTENTION_VALUES), 1) if rows == 1 else 1
    return rows, stride


def attention_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    query_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits a `scaled_dot_product_attention(query, key, ...)` call passes to its softmax, in float32.

    Keys shared by several query heads (grouped-query attention) are repeated to the query heads. Masked keys are
    -inf: `False` in a boolean `attn_mask`, the future under `is_causal` (top-left aligned, as torch does); a
    float `attn_mask` is added. `query_index` gives the positions of the queries when only some are passed.

    Shape:
        query (..., heads, L, E), key (..., heads or fewer, S, E) -> (..., heads, L, S).
    """
    q, k = query.detach().float(), key.detach().float()
    if q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * factor
    length, keys = scores.shape[-2], scores.shape[-1]
    positions = query_index if query_index is not None else torch.arange(length, device=scores.device)
    if is_causal:
        allowed = positions[:, None] >= torch.arange(keys, device=scores.device)[None, :]
        scores = scores.masked_fill(~allowed, -math.inf)
    if attn_mask is not None:
        mask = attn_mask.detach()
        if mask.shape[-2] != 1 and query_index is not None and mask.shape[-2] != length:
            mask = mask.index_select(-2, query_index)
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.float()
    return scores


def describe_attention(scores: torch.Tensor, probs: torch.Tensor, left_out: int = 0) -> torch.Tensor:
    """Per head, the accumulators `ATTENTION_FIELDS` of one attention call (float32, on the scores' device).

    A key is masked when its logit is -inf or below half the lowest value of the scores' dtype (Hugging Face
    masks with that value); masked keys are left out of the max logit and of the number of keys a query may
    attend to. Queries with no key left are left out.

    Args:
        scores: The logits as the softmax sees them.
        probs: The softmax of `scores` over the last dim (the attention weights).
        left_out: Queries per head that the caller did not pass (sampling).

    Shape:
        scores, probs (B, heads, L, S) -> (heads, len(ATTENTION_FIELDS)).
    """
    floor = torch.finfo(scores.dtype).min / 2 if scores.dtype.is_floating_point else -math.inf
    x = scores.detach().float()
    allowed = x > floor
    keys = allowed.sum(-1)  # (B, heads, L)
    largest = torch.where(allowed, x, -math.inf).amax(dim=(0, 2, 3))
    p = probs.detach().float()
    plogp = torch.where(p > 0, p * p.clamp_min(1e-38).log(), 0.0).sum(-1)
    several = keys > 1
    entropy = torch.where(several, -plogp / keys.clamp_min(2).float().log(), 0.0)
    some = keys > 0
    sink = torch.where(some, p[..., 0], 0.0)
    return torch.stack(
        (
            largest,
            entropy.sum(dim=(0, 2)),
            several.sum(dim=(0, 2)).float(),
            sink.sum(dim=(0, 2)),
            some.sum(dim=(0, 2)).float(),
            torch.full_like(largest, float(left_out)),
        ),
        dim=-1,
    )


def finish_attention(fields: torch.Tensor) -> torch.Tensor:
    """Accumulated `ATTENTION_FIELDS` -> the statistics (max_logit, entropy, sink, sampled), NaN where nothing
    was measured.

    Shape:
        (..., heads, len(ATTENTION_FIELDS)) -> (..., heads, 4).
    """
    f = fields.double()
    queries, counted = f[..., 4], f[..., 2]
    nan = torch.full_like(queries, math.nan)
    largest = torch.where(queries > 0, f[..., 0], nan)
    entropy = torch.where(counted > 0, f[..., 1] / counted.clamp_min(1), nan)
    sink = torch.where(queries > 0, f[..., 3] / queries.clamp_min(1), nan)
    sampled = torch.where(queries > 0, f[..., 5] / (queries + f[..., 5]).clamp_min(1), nan)
    return torch.stack((largest, entropy, sink, sampled), dim=-1)


def describe_residual(hidden: torch.Tensor, token_dim: int = -2) -> torch.Tensor:
    """(largest magnitude, its channel, its token, median magnitude) of a hidden state, float32.

    The channel is the last dim, the token the dim `token_dim`; the median comes from a strided sample of at
    most `RESIDUAL_SAMPLE` values.

    Shape:
        hidden (..., T, C) -> (4,).
    """
    x = hidden.detach()
    rows = x.abs().reshape(-1, x.shape[-1])  # logical (row-major) order, whatever the strides
    # each row's largest, then the channel in the first row holding the largest (NaN counts as largest): the first
    # such value in logical order, as one flat argmax finds it, several times faster on the CPU
    # (indexing with a 0-d tensor reads it on the host: a sync on CUDA; `index_select` and `take` do not)
    row = rows.amax(dim=1).argmax()
    index = row * rows.shape[1] + rows.index_select(0, row.view(1)).argmax()
    coordinates = _unravel(index, x.shape)
    flat = rows.reshape(-1)
    stride = max(flat.numel() // RESIDUAL_SAMPLE, 1)
    median = flat[::stride].float().median()
    return torch.stack((flat.take(index).float(), coordinates[-1].float(), coordinates[token_dim].float(), median))


def _unravel(index: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, ...]:
    coordinates = []
    for size in reversed(shape):
        coordinates.append(index % size)
        index = index // size
    return tuple(reversed(coordinates))
