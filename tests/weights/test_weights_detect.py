"""detect_weight_symmetry_breaking, find_duplicate_units, DeadUnitDetector, spectral_stats."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from weights_support import forbid_host_sync, make_mlp

from hookscope.hooks import list_hooks
from hookscope.weights import DeadUnitDetector, detect_weight_symmetry_breaking, find_duplicate_units, spectral_stats
from hookscope.weights._detect import has_close_rows


def _naive_close(rows: torch.Tensor, threshold: float) -> bool:
    return any(
        bool(((rows[i] - rows[j]).abs() <= threshold).all()) for i, j in itertools.combinations(range(len(rows)), 2)
    )


def test_constant_init_is_symmetric_and_random_init_is_not() -> None:
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 1), nn.LayerNorm(1))
    nn.init.constant_(model[2].weight, 0.3)
    nn.init.zeros_(model[2].bias)
    assert detect_weight_symmetry_breaking(model) == {"0": True, "2": False, "3": True}  # 1 unit: True; LN left out


def test_bias_is_part_of_the_unit_and_the_threshold_is_inclusive() -> None:
    layer = nn.Linear(2, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0], [1.0, 2.0], [5.0, 6.0]]))
        layer.bias.copy_(torch.tensor([0.0, 1.0, 0.0]))
    assert detect_weight_symmetry_breaking(nn.Sequential(layer)) == {"0": True}  # same weights, other bias
    with torch.no_grad():
        layer.bias[1] = 0.5
    assert detect_weight_symmetry_breaking(nn.Sequential(layer), threshold=0.5) == {"0": False}
    assert detect_weight_symmetry_breaking(nn.Sequential(layer), threshold=0.49) == {"0": True}
    with pytest.raises(ValueError, match="threshold must be a number >= 0, got -1"):
        detect_weight_symmetry_breaking(nn.Sequential(layer), threshold=-1)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(1, 24), st.sampled_from([0.0, 0.05, 0.3]), st.integers(0, 2**31 - 1))
def test_sorted_neighbour_search_matches_all_pairs(n: int, d: int, threshold: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 2 if d > 8 else 4, (n, d), generator=generator).float() * 0.1  # ties on a grid
    assert has_close_rows(rows, threshold) == _naive_close(rows, threshold)


def test_4096_unit_layer_with_one_planted_pair() -> None:
    layer = nn.Linear(4096, 4096)
    with torch.no_grad():
        layer.weight[4000] = layer.weight[17] + 5e-5
        layer.bias[4000] = layer.bias[17]
    assert detect_weight_symmetry_breaking(nn.Sequential(layer)) == {"0": False}
    with torch.no_grad():
        layer.weight[4000, 9] += 1.0
    assert detect_weight_symmetry_breaking(nn.Sequential(layer)) == {"0": True}


def test_duplicate_units_against_a_full_cosine_matrix() -> None:
    weight = torch.randn(8, 5)
    weight[3] = 2 * weight[1]
    weight[6] = weight[0] + 1e-4
    weight[7] = 0.0  # no direction: never a duplicate
    model = nn.Sequential(nn.Linear(5, 8))
    with torch.no_grad():
        model[0].weight.copy_(weight)
    unit = weight / weight.norm(dim=1, keepdim=True).clamp_min(1e-30)
    cosine = unit @ unit.T
    expected = [(i, j) for i in range(8) for j in range(i + 1, 8) if cosine[i, j] > 0.99 and i != 7 and j != 7]
    found = find_duplicate_units(model, 0.99)["0"]
    assert [(i, j) for i, j, _ in found.pairs] == expected == [(0, 6), (1, 3)]
    assert found.total == 2 and found.pairs[1][2] == pytest.approx(1.0, abs=1e-6)
    constant = nn.Sequential(nn.Linear(3, 50))
    nn.init.constant_(constant[0].weight, 0.1)
    many = find_duplicate_units(constant, max_pairs=5)["0"]
    assert many.total == 50 * 49 // 2 and len(many.pairs) == 5
    with pytest.raises(ValueError, match=r"threshold must be a cosine similarity in \[-1, 1\), got 1"):
        find_duplicate_units(constant, 1)
    with pytest.raises(ValueError, match="max_pairs must be an int >= 0, got -1"):
        find_duplicate_units(constant, max_pairs=-1)


def test_spectral_stats_against_singular_values() -> None:
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.Flatten(), nn.Linear(24, 7), nn.BatchNorm1d(7))
    stats = spectral_stats(model)
    assert set(stats) == {"0", "2"}  # BatchNorm's 1-d weight is left out
    for path in ("0", "2"):
        weight = model.get_submodule(path).weight.detach().double()
        singular = torch.linalg.svdvals(weight.reshape(weight.shape[0], -1))
        assert stats[path]["spectral_norm"] == pytest.approx(singular[0].item(), rel=1e-5)
        assert stats[path]["frobenius_norm"] == pytest.approx(singular.square().sum().sqrt().item(), rel=1e-5)
        assert stats[path]["stable_rank"] == pytest.approx(
            (singular.square().sum() / singular[0] ** 2).item(), rel=1e-4
        )
    approximate = spectral_stats(model, power_iterations=200)
    assert approximate["2"]["spectral_norm"] == pytest.approx(stats["2"]["spectral_norm"], rel=1e-3)
    zero = nn.Sequential(nn.Linear(2, 2, bias=False))
    nn.init.zeros_(zero[0].weight)
    assert spectral_stats(zero)["0"] == {"spectral_norm": 0.0, "frobenius_norm": 0.0, "stable_rank": 0.0}
    with pytest.raises(ValueError, match="power_iterations must be None or an int >= 1, got 0"):
        spectral_stats(model, power_iterations=0)


def test_dead_units_over_a_window_against_recorded_outputs() -> None:
    model = nn.Sequential(nn.Linear(3, 6), nn.ReLU())
    with torch.no_grad():
        model[0].bias.copy_(torch.tensor([-100.0, 0.0, 0.0, -100.0, 0.0, 100.0]))
    outputs = []
    detector = DeadUnitDetector(window=4).attach(model, "1")
    inputs = [torch.randn(5, 3) for _ in range(6)]
    with forbid_host_sync():
        for index, batch in enumerate(inputs):
            if index == 1:
                with torch.no_grad():
                    model[0].bias[3] = 100.0  # unit 3 is alive in forward 1 only
            if index == 2:
                with torch.no_grad():
                    model[0].bias[3] = -100.0
            outputs.append(model(batch).detach())
    recent = torch.stack(outputs[-4:])  # (window, B, units)
    expected = torch.nonzero(~(recent > 0).any(dim=0).any(dim=0)).flatten().tolist()
    assert detector.dead_units() == {"1": expected}
    assert expected == [0, 3]
    assert detector.forwards() == {"1": 6}
    assert detector.dead_fraction()["1"] == pytest.approx(2 / 6)


def test_dead_units_gate_eval_and_channel_axis() -> None:
    conv = nn.Sequential(nn.Conv2d(1, 3, 1), nn.ReLU())
    with torch.no_grad():
        conv[0].bias.copy_(torch.tensor([-100.0, 100.0, 100.0]))
    with DeadUnitDetector().attach(conv, nn.ReLU) as detector:
        conv.eval()
        conv(torch.randn(2, 1, 4, 4))
        assert detector.dead_units() == {}  # eval forwards are not counted by default
        conv.train()
        conv(torch.randn(2, 1, 4, 4))
        assert detector.dead_units() == {"1": [0]}  # the channel axis (1) of a 4-d output
        with pytest.raises(RuntimeError, match="already attached"):
            detector.attach(conv)
    assert list_hooks(conv) == []
    detector.reset()
    assert detector.dead_units() == {}
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        DeadUnitDetector(window=0)


def test_detectors_leave_hooks_and_model_untouched() -> None:
    model = make_mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    detect_weight_symmetry_breaking(model)
    find_duplicate_units(model)
    spectral_stats(model)
    assert list_hooks(model) == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
