"""fastai's probes: the examples of the issue, checked against hand-computed values."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hookscope.summary import (
    dummy_eval,
    has_params,
    layer_info,
    model_sizes,
    module_summary,
    num_features_model,
    total_params,
)


def conv_blocks() -> nn.Sequential:
    def block(cin: int, cout: int, stride: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(block(3, 16, 1), block(16, 32, 2), block(32, 32, 1))


def bn_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(1, 50), nn.ReLU(), nn.BatchNorm1d(50), nn.Linear(50, 1))


def modes(model: nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


def test_has_params() -> None:
    assert has_params(nn.LSTM(20, 10, 2))
    assert not has_params(nn.ReLU())
    assert has_params(nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
    assert not has_params(nn.BatchNorm2d(4, affine=False))


def test_total_params_examples() -> None:
    assert total_params(nn.Linear(10, 32)) == (352, True)
    assert total_params(nn.BatchNorm2d(20, affine=False)) == (0, False)
    assert total_params(nn.LSTM(20, 10, 2)) == (4 * (20 * 10 + 10) + 3 * 4 * (10 * 10 + 10), True)
    frozen = nn.Linear(3, 2).requires_grad_(False)
    assert total_params(frozen) == (8, False)
    tied = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    assert total_params(tied) == (16 + 4 + 4, True)


def test_dummy_eval_matches_a_zero_batch_in_eval_mode_and_restores_modes() -> None:
    model = conv_blocks().train()
    model[1][1].eval()
    before = modes(model)
    out = dummy_eval(model, size=(20, 12))
    assert modes(model) == before
    assert out.shape == (1, 32, 10, 6) and not out.requires_grad
    reference = conv_blocks()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = reference.eval()(torch.zeros(1, 3, 20, 12))
    torch.testing.assert_close(out, expected)


def test_model_sizes_issue_example() -> None:
    assert model_sizes(conv_blocks()) == [[1, 16, 64, 64], [1, 32, 32, 32], [1, 32, 32, 32]]


def test_model_sizes_of_a_childless_module_is_its_own_output() -> None:
    assert model_sizes(nn.Conv2d(2, 5, 3), size=(8, 8)) == [[1, 5, 6, 6]]


def test_dummy_eval_errors() -> None:
    with pytest.raises(ValueError, match="m must contain a layer with a weight of 2 or more dimensions"):
        dummy_eval(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match=r"size must be a tuple of positive ints .*got \(0, 4\)"):
        dummy_eval(conv_blocks(), size=(0, 4))


def test_num_features_model() -> None:
    assert num_features_model(conv_blocks()) == 32
    # Needs at least a 40x40 input: 32 fails, 64 runs.
    big_kernel = nn.Sequential(nn.Conv2d(3, 7, kernel_size=40), nn.ReLU())
    assert num_features_model(big_kernel) == 7


def test_num_features_model_names_the_last_failure() -> None:
    never_runs = nn.Sequential(nn.Conv2d(3, 1, 1), nn.Flatten(), nn.Linear(5, 2))
    before = modes(never_runs)
    with pytest.raises(RuntimeError, match=r"could not run m \(Sequential\).*last failure \(at 2048x2048\)") as info:
        num_features_model(never_runs)
    assert "module '2'" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(info.value.__cause__.__cause__, RuntimeError)  # torch's own shape error, chained
    assert modes(never_runs) == before


def test_layer_info_issue_example() -> None:
    model = bn_mlp().train()
    before = modes(model)
    infos = layer_info(model, torch.randn(16, 1))
    assert infos == [  # fastai's 5-tuples: '' for a layer without a weight, and whether the shape was kept
        ("Linear", 100, True, [1, 50], False),
        ("ReLU", "", "", [1, 50], True),
        ("BatchNorm1d", 100, True, [1, 50], True),
        ("Linear", 51, True, [1, 1], False),
    ]
    assert modes(model) == before


def test_layer_info_one_tuple_per_call_and_nested_outputs() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.Tanh()
            self.rnn = nn.GRU(3, 4, num_layers=2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.rnn(self.act(self.act(x)))
            return out

    infos = layer_info(Twice(), torch.zeros(5, 7, 3))  # (T, B, C): the first "sample" is T=1
    gru_params = sum(p.numel() for p in nn.GRU(3, 4, num_layers=2).parameters())
    assert infos == [
        ("Tanh", "", "", [1, 7, 3], True),
        ("Tanh", "", "", [1, 7, 3], True),
        ("GRU", "", "", [[1, 7, 4], [2, 7, 4]], False),  # no `weight` attribute: fastai leaves it blank
    ]
    assert gru_params > 0


def test_module_summary_prints_the_table_with_the_real_batch_size() -> None:
    model = bn_mlp()
    model[3].requires_grad_(False)
    text = module_summary(model, torch.randn(16, 1))
    rule, under = "=" * 76, "_" * 76
    expected = (  # fastai's text to the character: padded columns keep their trailing spaces, a blank line ends it
        f"Sequential (Input shape: 16 x 1)\n{rule}\n"
        f"{'Layer (type)':<20} {'Output Shape':<20} {'Param #':<10} {'Trainable':<10}\n{rule}\n"
        f"{'':<20} {'16 x 50':<20}\n"
        f"{'Linear':<20} {'':<20} {'100':<10} {'True':<10}\n"
        f"{'ReLU':<20} {'':<20} {'':<10} {'':<10}\n"
        f"{'BatchNorm1d':<20} {'':<20} {'100':<10} {'True':<10}\n{under}\n"
        f"{'':<20} {'16 x 1':<20}\n"
        f"{'Linear':<20} {'':<20} {'51':<10} {'False':<10}\n{under}\n"
        "\nTotal params: 251\nTotal trainable params: 200\nTotal non-trainable params: 51\n\n"
    )
    assert text == expected
