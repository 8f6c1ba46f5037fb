"""Side by side with peers on the same HF GPT-2 (built from a config, random weights, no download): nnsight 0.8
wraps the very module; TransformerLens 4.3's HF bridge wraps a copy. Recordings and a layer x position patching
sweep agree to 1e-5."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope import steer

warnings.filterwarnings("ignore", message=".*token_id must be `None` or an integer.*")
nnsight = pytest.importorskip("nnsight")

LAYERS, SEQ, N_EMBD = 2, 6, 32


def _gpt2() -> tuple[nn.Module, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=LAYERS, n_embd=N_EMBD, n_head=4, vocab_size=50, n_positions=16, use_cache=False,
        attn_implementation="eager",  # what TransformerLens's bridge forces: the same kernels on both sides
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval(), config


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.randint(0, 50, (2, SEQ))
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 7) % 50
    return clean, corrupted


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


@pytest.mark.slow
def test_recording_agrees_with_nnsight_and_transformer_lens() -> None:
    model, config = _gpt2()
    clean, _ = _inputs()
    with torch.no_grad(), steer.record(model, "transformer.h.*") as rec:
        model(clean)
    wrapped = nnsight.NNsight(model)
    with torch.no_grad(), wrapped.trace(clean):
        first = wrapped.transformer.h[0].output.save()
        second = wrapped.transformer.h[1].output.save()
    assert torch.allclose(rec["transformer.h.0"], first, atol=1e-5, rtol=0)
    assert torch.allclose(rec["transformer.h.1"], second, atol=1e-5, rtol=0)
    bridge_module = pytest.importorskip("transformer_lens.model_bridge.sources._bridge_builder")
    bridge = bridge_module.build_bridge_from_module(copy.deepcopy(model), "GPT2LMHeadModel", hf_config=config)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(clean)
    for layer in range(LAYERS):
        got = cache[f"blocks.{layer}.hook_resid_post"]
        assert torch.allclose(rec[f"transformer.h.{layer}"], got, atol=1e-5, rtol=0)


def _nnsight_sweep(model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    """nnsight's own way: save the clean blocks' outputs, then one invoke per cell, patched by assignment."""
    wrapped = nnsight.NNsight(model)
    with torch.no_grad():
        with wrapped.trace(clean):
            saved_0 = wrapped.transformer.h[0].output.save()
            saved_1 = wrapped.transformer.h[1].output.save()
            clean_logits = wrapped.lm_head.output.save()
        with wrapped.trace(corrupted):
            corrupted_logits = wrapped.lm_head.output.save()
    saved = [saved_0, saved_1]
    patched = []
    for layer in range(LAYERS):
        for position in range(SEQ):
            with torch.no_grad(), wrapped.trace(corrupted):
                wrapped.transformer.h[layer].output[:, position] = saved[layer][:, position]
                logits = wrapped.lm_head.output.save()
            patched.append(_metric(logits).double())
    low, high = _metric(corrupted_logits).double(), _metric(clean_logits).double()
    return ((torch.stack(patched) - low) / (high - low)).view(LAYERS, SEQ)


@pytest.mark.slow
def test_a_layer_by_position_sweep_agrees_with_nnsight_and_transformer_lens() -> None:
    model, config = _gpt2()
    clean, corrupted = _inputs()

    def metric(output: Any) -> torch.Tensor:
        return _metric(output.logits)

    result = steer.patch(model, clean, corrupted, metric, select="transformer.h.*", positions="each", batch_size=5)
    assert torch.allclose(result.effects, _nnsight_sweep(model, clean, corrupted), atol=1e-5, rtol=0)
    bridge_module = pytest.importorskip("transformer_lens.model_bridge.sources._bridge_builder")
    bridge = bridge_module.build_bridge_from_module(copy.deepcopy(model), "GPT2LMHeadModel", hf_config=config)
    with torch.no_grad():
        clean_logits, cache = bridge.run_with_cache(clean)
        low, high = _metric(bridge(corrupted)).double(), _metric(clean_logits).double()
        patched = []
        for layer in range(LAYERS):
            for position in range(SEQ):
                name = f"blocks.{layer}.hook_resid_post"

                def hook(value: torch.Tensor, hook: Any, name: str = name, position: int = position) -> torch.Tensor:
                    value[:, position] = cache[name][:, position]
                    return value

                patched.append(_metric(bridge.run_with_hooks(corrupted, fwd_hooks=[(name, hook)])).double())
    lens = ((torch.stack(patched) - low) / (high - low)).view(LAYERS, SEQ)
    assert torch.allclose(result.effects, lens, atol=1e-5, rtol=0)
