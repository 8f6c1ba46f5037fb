"""The engine's policies, each defined once and called by every consumer, against independent oracles: merging
norms (root of summed squares), the widest histogram range, the range exponent, the DTensor test, and
`distributed.grad_norms` using watch()'s norm."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hookscope.distributed import grad_norms, norm_of_shards
from hookscope.doctor._gradients import gradient_table
from hookscope.results import WatchResults
from hookscope.stats._dtensor import is_dtensor, is_sharded, local_part
from hookscope.stats._histogram import EXPONENT_NONE, added_at, counts, on_widest_range, range_exponent, tally
from hookscope.stats._norms import combine_norm_segments, combine_norms, norm_of, root_sum_squares
from hookscope.watch import watch
from stats_oracle import auto_exponent, auto_histogram

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def exact_root_sum_squares(norms: list[float]) -> float:
    """sqrt(sum(n**2)) in exact rational arithmetic, rounded once (no overflow, no underflow)."""
    total = sum(Fraction(n) ** 2 for n in norms)
    num, den = total.numerator, total.denominator
    root = math.isqrt(num * den * 4**128)  # sqrt(num / den) = sqrt(num * den) / den, with 128 more bits
    return float(Fraction(root, den * 2**128))


@SETTINGS
@given(
    st.lists(st.floats(0.0, 1e150, allow_nan=False), min_size=1, max_size=6),
    st.sampled_from((1.0, 1e-300, 1e150)),
)
def test_root_sum_squares_equals_the_exact_root_and_never_overflows(norms: list[float], factor: float) -> None:
    values = [n * factor for n in norms]
    got = float(root_sum_squares(torch.tensor(values, dtype=torch.float64)))
    want = exact_root_sum_squares(values)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-310)


def test_root_sum_squares_along_a_dim_and_with_inf() -> None:
    norms = torch.tensor([[3e200, 0.0], [4e200, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(root_sum_squares(norms, dim=0), torch.tensor([5e200, 2.0], dtype=torch.float64))
    torch.testing.assert_close(root_sum_squares(norms, dim=1), torch.tensor([3e200, 4e200], dtype=torch.float64))
    assert math.isinf(float(root_sum_squares(torch.tensor([1.0, math.inf]))))
    assert float(root_sum_squares(torch.zeros(3))) == 0.0


def test_combine_norms_and_norm_records_merge_by_the_one_rule() -> None:
    generator = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, generator=generator, dtype=torch.float64) * 1e180 for n in (5, 7, 3)]
    records = torch.stack([norm_of(p) for p in parts])
    whole = torch.cat(parts)
    want = math.sqrt(sum(float((p / 1e180).square().sum()) for p in parts)) * 1e180  # scaled by hand, no overflow
    folded = combine_norms(combine_norms(records[0], records[1]), records[2])
    grouped = combine_norm_segments(records, torch.zeros(3, dtype=torch.int64), 1)[0]
    for merged in (folded, grouped):
        assert float(merged[0]) == pytest.approx(want, rel=1e-12)
        assert merged[2].item() == whole.numel()
    assert float(norm_of_shards(torch.tensor(25.0))) == 5.0  # one process: the root of its own sum of squares


def test_range_exponent_is_the_oracle_exponent_of_the_largest_finite_magnitude() -> None:
    cases = [[0.5, -3.0, math.nan], [math.inf, 1.0], [0.0, 0.0], [1e-310], [2.0], [-(2.0**60), 1.0], []]
    for values in cases:
        got = int(range_exponent(torch.tensor(values, dtype=torch.float64)))
        want = auto_exponent(np.array(values, dtype=np.float64))
        assert got == (EXPONENT_NONE if want is None else want), values


@SETTINGS
@given(st.lists(st.sampled_from((1e-3, 0.7, 5.0, 300.0, 1e6)), min_size=2, max_size=5), st.integers(0, 2**31))
def test_histograms_on_the_widest_range_equal_one_histogram_of_all_values(scales: list[float], seed: int) -> None:
    bins = 8
    generator = torch.Generator().manual_seed(seed)
    parts = [torch.randn(20, generator=generator, dtype=torch.float64) * s for s in scales]
    exponents = torch.stack([range_exponent(p) for p in parts])
    hists = torch.stack([counts(p, torch.ones_like(p), bins, e) for p, e in zip(parts, exponents, strict=True)])
    widened, target = on_widest_range(hists, exponents)
    values = torch.cat(parts).numpy()
    want_exponent = auto_exponent(values)
    assert int(target) == want_exponent
    assert want_exponent is not None
    assert widened.sum(0)[:bins].tolist() == auto_histogram(values, bins, want_exponent).tolist()
    for part, row in zip(parts, widened, strict=True):  # each one alone, on the common range
        assert row[:bins].tolist() == auto_histogram(part.numpy(), bins, want_exponent).tolist()


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float64])
def test_tallies_off_the_cpu_equal_numpys_bincount(dtype: torch.dtype | None) -> None:
    """`added_at` (what `tally` does off the CPU, where bincount syncs) and `tally` on the CPU both equal numpy's
    bincount, unweighted (int64) and weighted (the weights' dtype), with indices up to the last slot."""
    generator = torch.Generator().manual_seed(3)
    index = torch.cat([torch.randint(0, 7, (200,), generator=generator), torch.tensor([9])])
    weights = None if dtype is None else torch.rand(index.shape, generator=generator, dtype=dtype)
    want = np.bincount(index.numpy(), None if weights is None else weights.double().numpy(), minlength=10)
    for got in (added_at(index, 10, weights), tally(index, 10, weights)):
        assert got.dtype == (torch.int64 if dtype is None else dtype) and got.shape == (10,)
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6)


def test_on_widest_range_of_nothing_is_the_empty_range() -> None:
    hists, target = on_widest_range(torch.zeros(0, 10), torch.zeros(0, dtype=torch.int64))
    assert hists.shape == (0, 10) and int(target) == EXPONENT_NONE


def test_plain_tensors_are_not_dtensors() -> None:
    x = torch.ones(3)
    assert not is_dtensor(x) and not is_sharded(x) and local_part(x) is x
    assert not is_dtensor(nn.Parameter(x)) and not is_dtensor(None)


def test_grad_norms_use_watch_norm_a_nan_is_counted_not_dropped() -> None:
    """One NaN in weight.grad: watch() reports the norm of the finite values and 1 non-finite value; so does
    grad_norms (it used to drop the parameter). The oracle is the float64 norm of the finite values."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)

    def poison(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad[1, 2] = math.nan
        return grad

    model.weight.register_hook(poison)
    with watch(model, exact=True) as w:
        model(torch.randn(5, 4)).sum().backward()
        norms = grad_norms(model)
    grad = model.weight.grad
    assert grad is not None
    finite = grad.double().nan_to_num(0.0).norm()
    assert set(norms) == {"weight", "bias"}
    assert float(norms["weight"]["norm"]) == pytest.approx(float(finite), rel=1e-12)
    assert float(norms["weight"]["nonfinite"]) == 1.0
    assert float(norms["bias"]["nonfinite"]) == 0.0
    watched = w.results().param_grads["weight"]
    assert float(watched["norm"][0]) == pytest.approx(float(norms["weight"]["norm"]), rel=1e-12)
    assert float(watched["nonfinite"][0]) == float(norms["weight"]["nonfinite"])


def test_the_doctor_combines_parameter_norms_per_module_by_the_one_rule() -> None:
    big = torch.tensor([3e200, 6e200], dtype=torch.float64)
    results = WatchResults(
        steps=torch.arange(2),
        layers={"0": "Linear"},
        param_grads={"0.weight": {"norm": big, "nonfinite": torch.zeros(2)}, "0.bias": {"norm": big * 4 / 3}},
    )
    paths, table = gradient_table(results)
    assert paths == ["0"]
    torch.testing.assert_close(table[0], torch.tensor([5e200, 10e200], dtype=torch.float64))  # squares overflow
