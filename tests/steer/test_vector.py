"""steer.steering_vector against the means and the principal direction computed by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hookscope import steer


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.mix = nn.Linear(6, 6)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mix(self.embed(tokens))


def test_mean_diff_is_the_difference_of_the_means_at_the_position() -> None:
    model = Tokens()
    positive, negative = torch.randint(0, 10, (5, 4)), torch.randint(0, 10, (3, 4))
    vectors = steer.steering_vector(model, positive, negative, select=["embed", "mix"], position=-1)
    with torch.no_grad():
        expected = model.mix(model.embed(positive))[:, -1].mean(0) - model.mix(model.embed(negative))[:, -1].mean(0)
    assert list(vectors) == ["embed", "mix"] and torch.allclose(vectors["mix"], expected, atol=1e-6)
    with torch.no_grad():
        steered = steer.intervene(model, {"mix": steer.Add(vectors["mix"], scale=1.0, positions=-1)})
        shifted = model(negative)[:, -1].mean(0)
        steered.remove()
    assert torch.allclose(shifted, model(positive)[:, -1].mean(0).detach(), atol=1e-5)  # the means meet


def test_pca_is_the_main_direction_of_the_paired_differences_with_the_mean_differences_sign() -> None:
    model = Tokens()
    negative = torch.randint(0, 10, (6, 3))
    positive = negative.clone()
    positive[:, 1] = (negative[:, 1] + 1) % 10
    vector = steer.steering_vector(model, positive, negative, select="mix", position=1, method="pca")["mix"]
    with torch.no_grad():
        differences = (model(positive)[:, 1] - model(negative)[:, 1]).double()
    _, _, vh = torch.linalg.svd(differences)
    mean = differences.mean(0)
    assert torch.allclose(vector.double(), vh[0] * torch.dot(mean, vh[0]), atol=1e-5)
    assert torch.dot(vector.double(), mean) > 0


def test_bad_arguments_are_refused() -> None:
    model = Tokens()
    tokens = torch.randint(0, 10, (2, 3))
    with pytest.raises(ValueError, match="method must be one of 'mean_diff', 'pca', got 'svd'"):
        steer.steering_vector(model, tokens, tokens, select="mix", method="svd")
    with pytest.raises(ValueError, match=r"position must index dim 1 of site 'mix'.*shape \(2, 3, 6\), got 5"):
        steer.steering_vector(model, tokens, tokens, select="mix", position=5)
    with pytest.raises(ValueError, match="method='pca' needs as many positive as negative inputs"):
        steer.steering_vector(model, tokens, tokens[:1], select="mix", method="pca")
