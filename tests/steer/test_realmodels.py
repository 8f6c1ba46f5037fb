"""Real models built from configs (GPT-2, BERT, ViT) and nn.TransformerEncoder: record, intervene and patch per
layer, per position and per head (through the output projection's input)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope import steer

from .oracles import call, loop_of_interventions

warnings.filterwarnings("ignore", message=".*token_id must be `None` or an integer.*")


@dataclass
class Case:
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[Any, Any, int]]  # clean, corrupted, the position where they differ
    metric: Callable[[Any], torch.Tensor]
    layers: str
    out_proj: str
    n_heads: int
    causal: bool


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16, use_cache=False)
    return GPT2LMHeadModel(config).eval()


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=16, num_labels=3, initializer_range=0.5,  # a metric span far above float32 noise
    )  # fmt: skip
    return BertForSequenceClassification(config).eval()


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=3,
    )  # fmt: skip
    return ViTForImageClassification(config).eval()


def _token_inputs(keyword: bool) -> Callable[[], tuple[Any, Any, int]]:
    def inputs() -> tuple[Any, Any, int]:
        clean = torch.randint(0, 50, (2, 6))
        corrupted = clean.clone()
        corrupted[:, 2] = (clean[:, 2] + 7) % 50
        if keyword:
            return {"input_ids": clean}, {"input_ids": corrupted}, 2
        return clean, corrupted, 2

    return inputs


def _image_inputs() -> tuple[Any, Any, int]:
    clean = torch.randn(2, 3, 8, 8)
    corrupted = clean.clone()
    corrupted[:, :, :4, 4:] = torch.randn(2, 3, 4, 4)  # patch 1 (after the CLS token: position 2)
    return clean, corrupted, 2


CASES = {
    "gpt2": Case(_gpt2, _token_inputs(False), lambda out: (out.logits[:, -1, 3] - out.logits[:, -1, 5]).mean(),
                 "transformer.h.*", "transformer.h.*.attn.c_proj", 4, True),
    "bert": Case(_bert, _token_inputs(True), lambda out: (out.logits[:, 0] - out.logits[:, 1]).mean(),
                 "bert.encoder.layer.*", "bert.encoder.layer.*.attention.output.dense", 4, False),
    "vit": Case(_vit, _image_inputs, lambda out: (out.logits[:, 0] - out.logits[:, 1]).mean(),
                "vit.layers.*", "vit.layers.*.attention.o_proj", 4, False),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_recording_each_layer_matches_the_models_own_hidden_states(name: str) -> None:
    case = CASES[name]
    model = case.build()
    clean, _, _ = case.inputs()
    arguments = dict(clean) if isinstance(clean, dict) else {"pixel_values" if name == "vit" else "input_ids": clean}
    with torch.no_grad(), steer.record(model, case.layers) as rec:
        hidden = model(**arguments, output_hidden_states=True).hidden_states
    assert len(rec) == 2
    first = next(iter(rec))
    assert torch.allclose(rec[first], hidden[1], atol=1e-6)  # the last is normalised by some models: layer 0 only


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_head_at_a_position_is_the_hand_written_hook(name: str) -> None:
    case = CASES[name]
    model = case.build()
    clean, _, position = case.inputs()
    site = case.out_proj.replace("*", "1")
    module = model.get_submodule(site)
    width = module.weight.shape[0] if type(module).__name__ == "Conv1D" else module.in_features
    size = width // case.n_heads

    def by_hand(m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        z = args[0].clone()
        z[:, position, 2 * size : 3 * size] = 0.0
        return (z, *args[1:])

    with torch.no_grad():
        handle = module.register_forward_pre_hook(by_hand)
        expected = call(model, clean).logits
        handle.remove()
        spec = steer.Zero(positions=position, heads=2, n_heads=case.n_heads)
        with steer.intervene(model, {site: spec}, at="input"):
            got = call(model, clean).logits
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_patching_layers_by_position_and_heads_matches_a_loop_of_interventions(name: str) -> None:
    case = CASES[name]
    model = case.build()
    clean, corrupted, differ = case.inputs()
    result = steer.patch(model, clean, corrupted, case.metric, select=case.layers, positions="each", batch_size=5)
    sites = result.sites
    seq = len(result.positions or [])
    expected = loop_of_interventions(model, clean, corrupted, case.metric, sites, positions=list(range(seq)))
    assert torch.allclose(result.effects, expected, atol=1e-5, rtol=0)
    whole = steer.patch(model, clean, corrupted, case.metric, select=sites[-1])
    assert torch.allclose(whole.effects, torch.ones(1, 1, dtype=torch.float64), atol=1e-6)  # the last layer: all
    if case.causal:  # before the first difference, clean and corrupted runs are the same
        assert result.effects[:, :differ].abs().max() <= 1e-6
    heads = steer.patch(
        model, clean, corrupted, case.metric, select=case.out_proj, at="input", positions=[differ, seq - 1],
        heads="each", n_heads=case.n_heads,
    )  # fmt: skip
    expected = loop_of_interventions(
        model, clean, corrupted, case.metric, heads.sites, positions=[differ, seq - 1], heads=list(range(4)),
        n_heads=4, at="input",
    )  # fmt: skip
    assert heads.effects.shape == (2, 2 * 4) and torch.allclose(heads.effects, expected, atol=1e-5, rtol=0)


def _encoder() -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


def test_transformer_encoder_records_intervenes_and_patches_per_layer_and_position() -> None:
    model = _encoder()
    clean = torch.randn(2, 5, 16)
    corrupted = clean.clone()
    corrupted[:, 3] = torch.randn(2, 16)
    with torch.no_grad():
        first = model.layers[0](clean)
        with steer.record(model, "layers.*") as rec:
            out = model(clean)
        assert torch.allclose(rec["layers.0"], first, atol=1e-6) and torch.equal(rec["layers.1"], out)
        with steer.intervene(model, {"layers.0": steer.Zero(positions=[1])}):
            got = model(clean)
        zeroed = first.clone()
        zeroed[:, 1] = 0.0
        assert torch.allclose(got, model.layers[1](zeroed), atol=1e-6)

    def metric(output: torch.Tensor) -> torch.Tensor:
        return output[:, 0].sum()

    result = steer.patch(model, clean, corrupted, metric, select="layers.*", positions="each")
    expected = loop_of_interventions(model, clean, corrupted, metric, result.sites, positions=list(range(5)))
    assert torch.allclose(result.effects, expected, atol=1e-5, rtol=0)
    last = torch.zeros(5, dtype=torch.float64)
    last[0] = 1.0  # the metric reads position 0 of the last layer's output, and only it
    assert torch.allclose(result.effects[1], last, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"ran 0 times.*nn.MultiheadAttention uses its out_proj's weights"):
        steer.patch(model, clean, corrupted, metric, select="layers.0.self_attn.out_proj", at="input")
