"""Record and norm tables: observations in random cells, small and large, flushed at random moments, equal the
oracle of every value each cell received (the machinery ActivationStats and watch() share)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hookscope.stats._histogram import EXPONENT_NONE
from hookscope.stats._record import STATISTICS, finalize
from hookscope.stats._sample import SAMPLE_SIZE, Sampler
from hookscope.stats._spec import Spec
from hookscope.stats._tables import SMALL_BELOW, NormTable, RecordTable
from hookscope.stats._units import UnitCounts, active, unit_dims
from stats_oracle import auto_exponent, auto_histogram, close, expected, values_of

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
ROWS, KEYS, BINS = 3, 3, 8


@st.composite
def observations(draw: st.DrawFn) -> list[tuple[int, int, torch.Tensor] | None]:
    """A list of (row, key, tensor) observations, with `None` where the table is flushed."""
    out: list[tuple[int, int, torch.Tensor] | None] = []
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.integers(0, 4)) == 0:
            out.append(None)
            continue
        generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
        size = draw(st.sampled_from((1, 5, 64, 40_000)))  # the last one is described at once (large)
        dtype = draw(st.sampled_from((torch.float32, torch.bfloat16, torch.float64)))
        x = (torch.randn(size, generator=generator) * 10.0 ** draw(st.integers(-3, 3))).to(dtype)
        if draw(st.booleans()):
            x[torch.randint(0, size, (1,), generator=generator)] = draw(st.sampled_from((math.nan, math.inf)))
        out.append((draw(st.integers(0, ROWS - 1)), draw(st.integers(0, KEYS - 1)), x))
    return out


def _observe(
    table: RecordTable | NormTable, steps: list[tuple[int, int, torch.Tensor] | None]
) -> dict[tuple[int, int], list[torch.Tensor]]:
    """Add each observation of `steps` to `table` (`None`: flush there), flush, and return what each cell saw."""
    seen: dict[tuple[int, int], list[torch.Tensor]] = {}
    for step in steps:
        if step is None:
            table.flush()
            continue
        row, key, x = step
        table.add(row, key, x)
        seen.setdefault((row, key), []).append(x)
    table.flush()
    return seen


@SETTINGS
@given(steps=observations(), bounded=st.booleans())
def test_record_table_cells_equal_the_oracle(steps: list[tuple[int, int, torch.Tensor] | None], bounded: bool) -> None:
    saturation = [(-1.0, 1.0) if bounded else None, None, (0.0, 1.0)]
    table = RecordTable(KEYS, Spec(), bins=BINS, saturation=saturation)
    table.allocate(ROWS, torch.device("cpu"))
    seen = _observe(table, steps)
    assert table.records is not None and table.hists is not None and table.exponents is not None
    finalized = finalize(table.records)
    for row in range(ROWS):
        for key in range(KEYS):
            values = values_of(*seen.get((row, key), []))
            wanted = expected(values, bounds=saturation[key])
            got = dict(zip(STATISTICS, finalized[row, key].tolist(), strict=True))
            assert got["count"] == wanted.count and got["nonfinite"] == wanted.nonfinite
            scale = max(abs(wanted.min), abs(wanted.max)) if wanted.count else 1.0
            for name in ("mean", "std", "min", "max", "near_zero", "saturated"):
                assert close(got[name], getattr(wanted, name), scale, 1e-7), (row, key, name)
            exponent = auto_exponent(values)
            if exponent is None:
                assert float(table.hists[row, key].sum()) == wanted.count  # zeros only, in the middle bin
                continue
            assert int(table.exponents[row, key]) == exponent
            assert table.hists[row, key, :BINS].tolist() == auto_histogram(values, BINS, exponent).tolist()


@SETTINGS
@given(steps=observations())
def test_norm_table_cells_equal_the_oracle(steps: list[tuple[int, int, torch.Tensor] | None]) -> None:
    table = NormTable(KEYS)
    table.allocate(ROWS, torch.device("cpu"))
    seen = _observe(table, steps)
    assert table.norms is not None
    for (row, key), tensors in seen.items():
        values = values_of(*tensors)
        wanted = expected(values)
        norm, nonfinite, count, _ = table.norms[row, key].tolist()
        assert close(norm, wanted.norm, wanted.norm, 1e-9)
        assert (nonfinite, count) == (wanted.nonfinite, values.size)


def test_unit_activity_of_small_and_large_outputs_equals_counting_each_unit() -> None:
    table = RecordTable(2, Spec(), unit_dim=lambda key, ndim: 1 if ndim == 4 else ndim - 1)
    table.allocate(1, torch.device("cpu"))
    small = [torch.randn(4, 6) for _ in range(3)]
    large = [torch.randn(8, 16, 20, 20) for _ in range(2)]  # 51200 values: described at once, exactly
    for x in small:
        table.add(0, 0, x)
    for x in large:
        table.add(0, 1, x)
    activity = table.unit_activity()
    want_small = np.mean([(x > 0).double().mean(0).numpy() for x in small], axis=0)
    want_large = torch.stack([(x > 0).double().mean((0, 2, 3)) for x in large]).mean(0)
    assert activity[0] is not None and np.allclose(activity[0].numpy(), want_small)
    assert activity[1] is not None and torch.allclose(activity[1], want_large)


def test_fixed_range_histograms_count_what_falls_outside() -> None:
    table = RecordTable(1, Spec(), bins=4, hist_range=(0.0, 1.0))
    table.allocate(1, torch.device("cpu"))
    table.add(0, 0, torch.tensor([-1.0, 0.1, 0.6, 1.0, 2.0, math.nan]))
    table.add(0, 0, torch.full((40_000,), 0.3))
    table.flush()
    assert table.hists is not None
    assert table.hists[0, 0].tolist() == [1.0, 40_000.0, 1.0, 1.0, 1.0, 1.0]  # 4 bins, below, above


def test_units_are_the_channels_of_4d_5d_and_channel_first_layers_else_the_last_dim() -> None:
    """`unit_dims` against the rule its module states, case by case: (module, ndim) -> (unit dim, dims reduced)."""
    cases = [
        (nn.Linear(2, 2), 1, None),
        (nn.Linear(2, 2), 2, (1, (0,))),
        (nn.Linear(2, 2), 3, (2, (0, 1))),  # (B, T, C): the features
        (None, 3, (2, (0, 1))),
        (None, 4, (1, (0, 2, 3))),
        (None, 5, (1, (0, 2, 3, 4))),
        (nn.Conv1d(2, 2, 1), 3, (1, (0, 2))),
        (nn.BatchNorm1d(2), 3, (1, (0, 2))),
        (nn.GroupNorm(1, 2), 3, (1, (0, 2))),
        (nn.LayerNorm(2), 3, (2, (0, 1))),
    ]
    for module, ndim, wanted in cases:
        assert unit_dims(module, ndim) == wanted, (module, ndim)


def test_unit_counts_saved_and_loaded_go_on_where_they_were() -> None:
    cpu = torch.device("cpu")
    units = UnitCounts(3)
    first, third = units.slot(0, 4, cpu), units.slot(2, 2, cpu)  # key 1 is never observed
    assert first is not None and third is not None
    positions = torch.tensor([first, first + 1, first + 2, first + 3, third, third + 1])
    active = torch.tensor([1.0, 0.0, 2.0, 3.0, 1.0, 0.0], dtype=torch.float64)
    units.add(positions, active, torch.tensor([2.0, 2.0, 2.0, 4.0, 1.0, 1.0], dtype=torch.float64))
    loaded = UnitCounts(3)
    loaded.load(units.state(), cpu)
    fractions = loaded.fractions()
    assert fractions[1] is None
    assert fractions[0] is not None and fractions[0].tolist() == [0.5, 0.0, 1.0, 0.75]
    assert fractions[2] is not None and fractions[2].tolist() == [1.0, 0.0]
    start = loaded.slot(2, 2, cpu)
    assert start is not None
    loaded.add(torch.tensor([start, start + 1]), torch.tensor([0.0, 3.0], dtype=torch.float64), 3.0)
    after = loaded.fractions()[2]
    assert after is not None and after.tolist() == [0.25, 0.75]  # (1 + 0) / (1 + 3), (0 + 3) / (1 + 3)
    assert loaded.mismatch == 0


def test_a_discarded_row_id_forgets_its_cells_and_what_waits_for_them() -> None:
    """Row ids wrap around the rows (a ring of steps): `discard(5)` of a 3-row table empties row 2 and what waits
    for row id 5 and leaves the other rows alone. `pending_values` counts the values waiting: copies of tensors
    below `SMALL_BELOW` values, the sample of larger ones; on the CPU a larger one of finite values (a finite sum
    of squares) is recorded exactly at once, and nothing of it waits or is sampled."""
    table = NormTable(1, Sampler(seed=0))
    table.allocate(3, torch.device("cpu"))
    assert table.pending_values == 0
    table.add(5, 0, torch.randn(10))
    table.flush()
    small, large, with_nan = torch.randn(SMALL_BELOW - 1), torch.randn(SMALL_BELOW), torch.randn(SMALL_BELOW)
    with_nan[3] = math.nan
    table.add(5, 0, torch.randn(5))
    table.add(5, 0, with_nan)
    table.add(4, 0, small)
    table.add(4, 0, large)
    assert table.pending_values == 5 + small.numel() + SAMPLE_SIZE
    table.discard(5)
    assert table.pending_values == small.numel()
    table.flush()
    assert table.pending_values == 0 and table.norms is not None
    wanted = expected(values_of(small, large)).norm
    assert table.norms[:, 0, 0].tolist() == pytest.approx([0.0, wanted, 0.0], rel=1e-6)
    assert table.norms[1, 0, 2:].tolist() == [small.numel() + large.numel(), 0.0]  # counted, none sampled


def test_a_table_allocated_on_another_device_writes_what_waits_then_moves_there() -> None:
    """The "meta" device stands for a second device on a machine without one: only where tensors live is read."""
    for table in (RecordTable(1, Spec(), bins=4), NormTable(1)):
        table.allocate(2, torch.device("cpu"))
        table.add(0, 0, torch.randn(5))
        assert table.is_pending
        table.allocate(2, torch.device("meta"))
        assert not table.is_pending and table.device == torch.device("meta")
        held = [table.records, table.hists] if isinstance(table, RecordTable) else [table.norms]
        assert [t.device.type for t in held if t is not None] == ["meta"] * len(held)


def test_reset_rows_are_empty_and_grown_tables_keep_their_rows() -> None:
    table = RecordTable(2, Spec(), bins=4, saturation=[(0.0, 1.0), None])
    table.allocate(2, torch.device("cpu"))
    for row in range(2):
        for key in range(2):
            table.add(row, key, torch.rand(6) + row)
    table.flush()
    assert table.records is not None and table.hists is not None and table.exponents is not None
    kept = [t[0].clone() for t in (table.records, table.hists, table.exponents)]
    table.reset(torch.tensor([1]))
    table.allocate(4, torch.device("cpu"))
    assert table.records is not None and table.hists is not None and table.exponents is not None
    for now, before in zip((table.records, table.hists, table.exponents), kept, strict=True):
        torch.testing.assert_close(now[0], before, rtol=0, atol=0, equal_nan=True)  # row 0 as it was
    empty = [[0.0, 0.0, 0.0, math.inf, -math.inf, 0.0, 0.0, saturated, 0.0] for saturated in (0.0, math.nan)]
    for row in (1, 2, 3):  # reset, and new
        torch.testing.assert_close(table.records[row], torch.tensor(empty, dtype=torch.float64), equal_nan=True)
        assert not table.hists[row].any() and table.exponents[row].tolist() == [EXPONENT_NONE] * 2


def test_sampled_tensors_of_several_keys_keep_their_saturation_and_unit_activity_apart() -> None:
    """Two sampled keys, a sigmoid's and a tanh's NCHW outputs: each key's saturated share within the sampling
    error of the oracle's, and each channel's activity exact where it is certain: the sigmoid's always active, the
    tanh's dead channels 0 and always active ones 1."""
    z = torch.randn(16, 8, 24, 24) * 4.0
    z[:, :2] = -50.0
    z[:, 2:4] = 50.0
    outputs = [torch.sigmoid(z), torch.tanh(z)]
    bounds = [(0.0, 1.0), (-1.0, 1.0)]
    sampler = Sampler(seed=5)
    table = RecordTable(2, Spec(), saturation=bounds, sampler=sampler, unit_dim=lambda key, ndim: 1)
    table.allocate(1, torch.device("cpu"))
    for key, x in enumerate(outputs):
        table.add(0, key, x)
    sigmoid, tanh = table.unit_activity()
    assert table.records is not None
    finalized = finalize(table.records[0])
    for key, x in enumerate(outputs):
        wanted = expected(values_of(x), bounds=bounds[key])
        saturated = float(finalized[key, STATISTICS.index("saturated")])
        assert 0.3 < wanted.saturated < 0.8
        assert abs(saturated - wanted.saturated) <= 3 * math.sqrt(0.25 / 7000)  # a share of a sample of 7000+
    assert sigmoid is not None and sigmoid.tolist() == [1.0] * 8
    assert tanh is not None and (tanh[:2] == 0).all() and (tanh[2:4] == 1).all()


def test_sampled_unit_activity_counts_each_sampled_value_in_its_own_unit() -> None:
    """Sampled tensors of several shapes in one block, flushed three times (new random starts each time, starts
    past `inner` and units that wrap): each unit's activity equals counting the sampled values themselves, found by
    a twin sampler (same seed, same draws) and sorted into units by `(position // inner) % units`."""
    shapes = [(600, 8, 2, 2), (64, 20, 13), (100, 3, 3, 3, 7), (17_000,)]  # all sampled: 16384 values or more
    unit_dim = {0: 1, 1: 2, 2: 1, 3: None}
    table = RecordTable(4, Spec(), sampler=Sampler(size=512, seed=3), unit_dim=lambda key, ndim: unit_dim[key])
    table.allocate(3, torch.device("cpu"))
    twin = Sampler(size=512, seed=3)
    generator = torch.Generator().manual_seed(0)
    active: dict[int, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}
    for row in range(3):
        for key, shape in enumerate(shapes):
            x = torch.randn(shape, generator=generator) + torch.linspace(-1, 1, shape[-1])
            table.add(row, key, x)
            comb, count, slack = twin.positions(x.numel(), x.device)
            position = comb[:count] + twin.draw(slack)
            dim = unit_dim[key]
            if dim is None:
                continue
            units = shape[dim]
            unit = (position // math.prod(shape[dim + 1 :])) % units
            weight = x.numel() / count
            on = (x.reshape(-1)[position] > 0).double() * weight
            zeros = torch.zeros(units, dtype=torch.float64)
            active[key] = active.get(key, zeros).index_add(0, unit, on)
            seen[key] = seen.get(key, zeros).index_add(0, unit, torch.full_like(on, weight))
        table.flush()
    activity = table.unit_activity()
    assert activity[3] is None
    for key, want in active.items():
        got = activity[key]
        assert got is not None and torch.allclose(got, want / seen[key], rtol=1e-5, atol=0.0)  # float32 weights


def test_tensors_of_16384_values_or_more_are_sampled_and_owned_copies_are_kept_as_they_are() -> None:
    """README: outputs of 16384 values or more are described from a sample, smaller ones exactly; a float32 tensor
    handed over as `owned` is described like a copy of it."""
    table = RecordTable(3, Spec(), sampler=Sampler())
    table.allocate(1, torch.device("cpu"))
    owned = torch.randn(50)
    wanted = expected(values_of(owned))
    table.add(0, 0, torch.randn(16_383))
    table.add(0, 1, torch.randn(16_384))
    table.add(0, 2, owned, owned=True)
    table.flush()
    assert table.records is not None
    finalized = finalize(table.records[0])
    assert finalized[:, STATISTICS.index("sampled")].tolist() == [0.0, 1.0, 0.0]
    got = dict(zip(STATISTICS, finalized[2].tolist(), strict=True))
    assert close(got["mean"], wanted.mean, 3.0, 1e-7) and close(got["std"], wanted.std, 3.0, 1e-7)


def test_an_empty_tensor_leaves_no_trace() -> None:
    table = RecordTable(1, Spec(), bins=4, unit_dim=lambda key, ndim: ndim - 1)
    table.allocate(1, torch.device("cpu"))
    table.add(0, 0, torch.empty(0, 4))
    assert not table.is_pending and table.pending_values == 0
    assert table.unit_activity() == [None] and table.units.mismatch == 0
    table.add(0, 0, torch.ones(2, 3))  # its first units: 3
    activity = table.unit_activity()[0]
    assert activity is not None and activity.tolist() == [1.0, 1.0, 1.0] and table.units.mismatch == 0


def test_small_outputs_with_nonfinite_values_count_each_unit_as_the_oracle() -> None:
    """Small outputs of several keys described together (one `add_whole` for all): a unit's activity is the share
    of its values that are finite and > 0, NaN, inf and -0.0 included, over every value it had."""
    table = RecordTable(3, Spec(), bins=4, unit_dim=lambda key, ndim: None if key == 2 else ndim - 1)
    table.allocate(2, torch.device("cpu"))
    generator = torch.Generator().manual_seed(5)
    outputs = {0: [torch.randn(5, 3, generator=generator) for _ in range(3)]}
    outputs[1] = [torch.randn(2, 7, generator=generator)]
    outputs[0][1][0] = torch.tensor([math.nan, math.inf, -0.0])
    outputs[1][0][1, :3] = torch.tensor([-math.inf, 0.0, math.inf])
    for row, x in enumerate(outputs[0]):
        table.add(row % 2, 0, x)
    table.add(0, 1, outputs[1][0])
    table.add(1, 2, torch.randn(4, 4, generator=generator))  # a key without units: counted nowhere
    activity = table.unit_activity()
    for key, xs in outputs.items():
        every = torch.cat(xs)
        wanted = (torch.isfinite(every) & (every > 0)).double().mean(0)
        found = activity[key]
        assert found is not None and torch.allclose(found, wanted, rtol=0, atol=1e-15), key
    assert activity[2] is None


def test_unit_layouts_are_rebuilt_when_the_unit_counts_are_loaded() -> None:
    """Loaded unit counts place the keys in key order; a table that had placed them otherwise (its cached layouts
    hold the old positions) counts its next outputs in the loaded positions: their activity equals counting them
    on top of what was loaded."""
    cpu = torch.device("cpu")
    table = RecordTable(2, Spec(), unit_dim=lambda key, ndim: ndim - 1)
    table.allocate(1, cpu)
    first, second = torch.randn(4, 3), torch.randn(4, 5)
    for _ in range(2):  # the same arrangement twice: the second flush reuses the cached layout
        table.add(0, 1, first)  # key 1 first: its units come first in the counts
        table.add(0, 0, second)
        table.flush()
    saved = UnitCounts(2)
    saved.slot(0, 5, cpu), saved.slot(1, 3, cpu)  # key order, as a saved state is loaded
    table.load_units(saved.state(), cpu)
    table.add(0, 1, first)
    table.add(0, 0, second)
    activity = table.unit_activity()
    for key, x in ((0, second), (1, first)):
        found = activity[key]
        assert found is not None and torch.allclose(found, (x > 0).double().mean(0)), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_a_value_is_active_when_it_is_finite_and_above_zero(dtype: torch.dtype) -> None:
    special = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-30, -1e-30, 3.0, -3.0]
    x = torch.tensor([0, 1, -1, 5] if not dtype.is_floating_point else special).to(dtype)
    wanted = [1.0 if math.isfinite(v) and v > 0 else 0.0 for v in x.double().tolist()]
    found = active(x)
    assert found.dtype == (dtype if dtype.is_floating_point else torch.float64)
    assert found.double().tolist() == wanted


def test_one_arrangement_of_cells_flushed_round_the_ring_lands_in_its_own_slots() -> None:
    """A steady loop flushes the same arrangement of cells (two rows, three keys) at every place of the ring of
    rows, wrapping round its end too (row ids 2 and 3 of a ring of 3 are slots 2 and 0): each cell then holds the
    norm of what it received since its row was last reset, as the oracle counts it."""
    table = NormTable(KEYS)
    table.allocate(ROWS, torch.device("cpu"))
    assert table.norms is not None
    generator = torch.Generator().manual_seed(7)
    for first in range(6):
        table.reset(torch.tensor([first % ROWS, (first + 1) % ROWS]))
        received: dict[tuple[int, int], torch.Tensor] = {}
        for row, key in ((first, 0), (first, 2), (first + 1, 1), (first + 1, 0), (first, 0)):
            x = torch.randn(5, generator=generator)
            table.add(row, key, x)
            received[(row, key)] = torch.cat([received.get((row, key), torch.zeros(0)), x])
        table.flush()
        for row in (first, first + 1):
            for key in range(KEYS):
                values = received.get((row, key), torch.zeros(0))
                norm, _, count, _ = table.norms[row % ROWS, key].tolist()
                assert count == values.numel(), (first, row, key)
                assert math.isclose(norm, float(values.double().norm()), rel_tol=1e-12), (first, row, key)
