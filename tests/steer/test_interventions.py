"""Each intervention against a hand-written edit of the same region (the oracle), its checks and its gradients."""

from __future__ import annotations

import pytest
import torch

from hookscope import steer


def _value() -> torch.Tensor:
    return torch.randn(2, 5, 8)  # [batch, seq, features]; 2 heads of 4


def test_whole_value_edits_match_plain_tensor_arithmetic() -> None:
    x = _value()
    direction = torch.randn(8)
    unit = direction / direction.norm()
    along = (x @ unit).unsqueeze(-1) * unit
    cases = [
        (steer.Zero(), torch.zeros_like(x)),
        (steer.Scale(3.0), x * 3.0),
        (steer.Add(torch.arange(8.0), scale=0.5), x + 0.5 * torch.arange(8.0)),
        (steer.Replace(torch.ones(8)), torch.ones_like(x)),
        (steer.Mean(torch.full((8,), 2.0)), torch.full_like(x, 2.0)),
        (steer.Clamp(min=-0.5, max=0.25), torch.minimum(torch.maximum(x, torch.tensor(-0.5)), torch.tensor(0.25))),
        (steer.Project(direction), x - along),
        (steer.Project(direction, keep="on"), along),
    ]
    for intervention, expected in cases:
        assert torch.allclose(intervention.apply(x), expected, atol=1e-6), intervention


def test_positions_and_heads_edit_only_their_region() -> None:
    x = _value()
    got = steer.Zero(positions=[1, 3], heads=[1], n_heads=2).apply(x)
    expected = x.clone()
    expected[:, [1, 3], 4:8] = 0.0
    assert torch.equal(got, expected)
    got = steer.Add(torch.ones(4), heads=0, n_heads=2, positions=2).apply(x)
    expected = x.clone()
    expected[:, 2, 0:4] += 1.0
    assert torch.equal(got, expected)
    got = steer.Scale(2.0, positions=slice(1, 4)).apply(x)
    expected = x.clone()
    expected[:, 1:4] *= 2.0
    assert torch.equal(got, expected)
    before = x.clone()
    steer.Zero(positions=[0]).apply(x)
    assert torch.equal(x, before)  # nothing in place


def test_replace_broadcasts_a_region_shaped_value() -> None:
    x = _value()
    value = torch.randn(2, 2, 8)  # [batch, 2 positions, features]
    got = steer.Replace(value, positions=[0, 4]).apply(x)
    expected = x.clone()
    expected[:, [0, 4]] = value
    assert torch.equal(got, expected)


def test_gradients_flow_as_through_the_same_hand_written_edit() -> None:
    x = _value().requires_grad_(True)
    weight = torch.randn(8)
    (steer.Scale(3.0, positions=[2], heads=[0], n_heads=2).apply(x) * weight).sum().backward()
    got = x.grad
    y = x.detach().clone().requires_grad_(True)
    edited = y.clone()
    edited[:, 2, 0:4] = edited[:, 2, 0:4] * 3.0
    (edited * weight).sum().backward()
    assert got is not None and torch.equal(got, y.grad)


def test_interventions_are_frozen_values_with_equality_and_a_short_repr() -> None:
    add = steer.Add(torch.ones(3), scale=2.0, positions=[1])
    assert add == steer.Add(torch.ones(3), scale=2.0, positions=[1])
    assert add != steer.Add(torch.zeros(3), scale=2.0, positions=[1])
    assert repr(add) == "Add(positions=[1], vector=<tensor (3,) float32>, scale=2.0)"
    with pytest.raises(AttributeError):
        add.scale = 3.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: steer.Zero(heads=[1]), ValueError, r"heads=\[1\] needs n_heads="),
        (lambda: steer.Zero(heads=[2], n_heads=2), ValueError, r"heads must be in \[0, 2\) for n_heads=2, got \[2\]"),
        (lambda: steer.Zero(positions="each"), TypeError, "positions must be None, an int, a non-empty list"),
        (lambda: steer.Zero(n_heads=0), ValueError, "n_heads must be a positive int, got 0"),
        (lambda: steer.Scale(float("nan")), TypeError, "factor must be a finite number, got nan"),
        (
            lambda: steer.Add([1.0, 2.0]),
            TypeError,
            r"vector must be a torch.Tensor, got \[1.0, 2.0\]; e.g. Add\(vector=torch.tensor",
        ),
        (lambda: steer.Clamp(), ValueError, "Clamp needs min= or max="),
        (lambda: steer.Clamp(min=1.0, max=0.0), ValueError, "Clamp min must be <= max"),
        (lambda: steer.Project(torch.ones(3), keep="both"), ValueError, "keep must be 'off' or 'on', got 'both'"),
        (lambda: steer.Project(torch.ones(2, 3)), ValueError, r"direction must be a 1-dim vector, got shape \(2, 3\)"),
        (lambda: steer.Zero(seq_dim=0), ValueError, r"seq_dim must be an int >= 1"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(build: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        build()  # type: ignore[operator]


def test_shapes_are_checked_when_applied_naming_the_site_the_shape_and_the_fix() -> None:
    x = _value()
    with pytest.raises(ValueError, match=r"Add.vector of shape \(5,\) does not fit site 'blocks.0'.*shape \(2, 5, 8\)"):
        steer.Add(torch.ones(5)).apply(x, "blocks.0")
    with pytest.raises(
        ValueError, match=r"needs a last dimension divisible by n_heads=3, got a value of shape \(2, 5, 8\)"
    ):
        steer.Zero(heads=[0], n_heads=3).apply(x, "attn")
    with pytest.raises(ValueError, match=r"positions must be in \[-5, 5\) at site 'h' .*got \[7\]"):
        steer.Zero(positions=[7]).apply(x, "h")
    with pytest.raises(ValueError, match="has no sequence dimension there: pass seq_dim=, or positions=None"):
        steer.Zero(positions=0).apply(torch.randn(2, 8), "fc")
