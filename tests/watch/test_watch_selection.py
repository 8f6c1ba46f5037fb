"""watch()'s default selection on real layouts: leaf activations only, out_proj's weights without out_proj."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn as nn

from hookscope.watch import watch
from hookscope.watch._watch import default_selector
from realmodels.blocks import Conv2dNormActivation, MobileNetV3Small, Seq2SeqTransformer
from realmodels.zoo import expected_layers


def test_conv_norm_activation_containers_are_not_selected_but_their_parts_are() -> None:
    model = MobileNetV3Small()
    containers = [p for p, m in model.named_modules() if isinstance(m, Conv2dNormActivation)]
    assert len(containers) == 10 and all(not default_selector(p, model.get_submodule(p)) for p in containers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with watch(model) as w:
            model(torch.randn(2, 3, 16, 16)).sum().backward()
    layers = list(w.results().layers)
    assert layers == expected_layers(model)
    assert not set(layers) & set(containers) and {f"{c}.0" for c in containers} <= set(layers)
    assert len(layers) == len(set(layers))  # no layer recorded twice under two names


def test_library_activations_named_activation_are_selected_when_they_are_leaves() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    activations = pytest.importorskip("transformers.activations")
    gelu = activations.GELUActivation()
    assert default_selector("act", gelu) and default_selector("act", activations.NewGELUActivation())

    class BlockActivation(nn.Module):  # a container named like an activation
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.ReLU()

    assert not default_selector("x", BlockActivation())


def test_every_multihead_attention_out_proj_is_left_out_and_its_parameters_recorded() -> None:
    model = Seq2SeqTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 32, (4, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with watch(model, optimizer) as w:
            for _ in range(2):
                nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
                optimizer.step()
                optimizer.zero_grad()
    results = w.results()
    assert list(results.layers) == expected_layers(model) and results.unobserved == {}
    out_proj = [n for n, _ in model.named_parameters() if ".out_proj." in n]
    assert len(out_proj) == 6  # encoder self, decoder self and cross attention: weight and bias each
    for name in out_proj:
        assert torch.isfinite(results.param_grads[name]["norm"]).all() and (results.update_ratios[name] > 0).all()
