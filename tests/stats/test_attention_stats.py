"""The attention statistics of the engine against a naive oracle: masks as torch and Hugging Face write them,
grouped-query attention, sampling of rows and queries, the residual stream's largest value."""

from __future__ import annotations

import math

import pytest
import torch

from hookscope.stats._attention import (
    ATTENTION_VALUES,
    attention_scores,
    attention_slice,
    describe_attention,
    describe_residual,
    finish_attention,
)


def _oracle(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor) -> list[tuple[float, float, float]]:
    """Per head (max logit, mean normalised entropy, mean first-key share), one query at a time, in float64."""
    batch, heads, length, width = q.shape
    out = []
    for h in range(heads):
        top, entropies, shares = -math.inf, [], []
        for b in range(batch):
            for i in range(length):
                keys = [j for j in range(k.shape[-2]) if bool(allowed[b, h, i, j])]
                if not keys:
                    continue
                logits = torch.tensor([float(q[b, h, i] @ k[b, h, j]) / math.sqrt(width) for j in keys])
                top = max(top, float(logits.max()))
                p = logits.double().softmax(0)
                shares.append(float(p[0]) if keys[0] == 0 else 0.0)
                if len(keys) > 1:
                    entropies.append(float(-(p * p.log()).sum()) / math.log(len(keys)))
        out.append((top, sum(entropies) / len(entropies), sum(shares) / len(shares)))
    return out


def _check(fields: torch.Tensor, expected: list[tuple[float, float, float]]) -> None:
    stats = finish_attention(fields)
    got = stats[:, :3].tolist()
    for row, want in zip(got, expected, strict=True):
        assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) for a, b in zip(row, want, strict=True)), (row, want)


def test_a_padding_mask_written_with_the_dtypes_lowest_value_leaves_those_keys_out() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    padding = torch.tensor([[True] * 5, [True, True, True, False, False]])  # the second sequence is 3 long
    additive = torch.where(padding, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]  # as Hugging Face
    scores = attention_scores(q, k, additive, is_causal=True, scale=None)
    fields = describe_attention(scores, scores.softmax(-1))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    _check(fields, _oracle(q, k, (causal & padding[:, None, None, :]).expand(2, 3, 5, 5)))


def test_grouped_query_attention_repeats_the_keys_and_a_boolean_mask_keeps_true() -> None:
    torch.manual_seed(1)
    q, k = torch.randn(1, 4, 3, 2), torch.randn(1, 2, 3, 2)
    mask = torch.tensor([[True, False, True], [True, True, False], [False, True, True]])
    scores = attention_scores(q, k, mask, is_causal=False, scale=None)
    fields = describe_attention(scores, scores.softmax(-1))
    _check(fields, _oracle(q, k.repeat_interleave(2, dim=1), mask.expand(1, 4, 3, 3)))


def test_sampling_reads_whole_rows_first_then_every_kth_query_within_the_budget() -> None:
    assert attention_slice(4, 2, 8, 8) == (4, 1)
    per_row = ATTENTION_VALUES // 2
    assert attention_slice(8, 2, per_row // 16, 8) == (2, 1)
    rows, stride = attention_slice(3, 4, 1024, 1024)
    assert rows == 1 and 4 * math.ceil(1024 / stride) * 1024 <= ATTENTION_VALUES


def test_the_residual_streams_largest_value_channel_and_token() -> None:
    hidden = torch.randn(2, 6, 5)
    hidden[1, 4, 3] = -50.0
    largest, channel, token, median = describe_residual(hidden).tolist()
    assert (largest, channel, token) == (50.0, 3.0, 4.0)
    assert math.isclose(median, float(hidden.abs().median()), rel_tol=0.1)
    sequence_first = hidden.transpose(0, 1)  # (T, B, C)
    assert describe_residual(sequence_first, token_dim=0)[2].item() == 4.0


@pytest.mark.parametrize("case", ["random", "ties", "nan", "transposed", "one_token"])
def test_the_residual_streams_largest_value_is_the_first_in_logical_order_as_a_flat_argmax_finds_it(case: str) -> None:
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 7, 6, generator=generator)
    if case == "ties":
        hidden[0, 5, 4], hidden[1, 2, 1], hidden[2, 0, 0] = 9.0, -9.0, 9.0
    elif case == "nan":
        hidden[1, 3, 2], hidden[2, 1, 5] = math.nan, math.nan
    elif case == "transposed":
        hidden = hidden.transpose(1, 2)
    elif case == "one_token":
        hidden = hidden[:, :1]
    flat = hidden.abs().reshape(-1)  # the oracle: one argmax over every value in logical order
    index = int(flat.argmax())
    channel, token = index % hidden.shape[-1], index // hidden.shape[-1] % hidden.shape[-2]
    largest, found_channel, found_token, _ = describe_residual(hidden).tolist()
    assert (found_channel, found_token) == (channel, token)
    assert math.isnan(largest) if case == "nan" else largest == float(flat[index])
