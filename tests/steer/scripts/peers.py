"""Record and sweep one GPT-2 (built from a config) with hookscope, nnsight 0.8 and TransformerLens 4.3's HF bridge;
print the largest absolute differences from hookscope as JSON.

Run in its own process by tests/steer/test_peers.py: importing nnsight replaces `torch.Tensor.backward` for the
whole process (to support `with loss.backward():`), and that replacement reads the caller's source file on every
`backward()`, which breaks other tests that run in the same worker (documentation pages run as code, threads).
"""

from __future__ import annotations

import copy
import json
import warnings
from typing import Any

import nnsight
import torch
import torch.nn as nn
from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
from transformers import GPT2Config, GPT2LMHeadModel

from hookscope import steer

warnings.filterwarnings("ignore", message=".*token_id must be `None` or an integer.*")
LAYERS, SEQ = 2, 6


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


def _normalised(patched: list[torch.Tensor], clean: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    low, high = corrupted.double(), clean.double()
    return ((torch.stack(patched).double() - low) / (high - low)).view(LAYERS, SEQ)


def nnsight_values(model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor) -> tuple[list[Any], torch.Tensor]:
    """nnsight's way: save the clean blocks' outputs, then one trace per cell, patched by assignment."""
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
            patched.append(_metric(logits))
    return saved, _normalised(patched, _metric(clean_logits), _metric(corrupted_logits))


def lens_values(model: nn.Module, config: Any, clean: torch.Tensor, corrupted: torch.Tensor) -> tuple[list[Any], Any]:
    """TransformerLens's bridge around a copy (it rebuilds the module tree): run_with_cache, run_with_hooks."""
    bridge = build_bridge_from_module(copy.deepcopy(model), "GPT2LMHeadModel", hf_config=config)
    with torch.no_grad():
        clean_logits, cache = bridge.run_with_cache(clean)
        corrupted_metric = _metric(bridge(corrupted))
        patched = []
        for layer in range(LAYERS):
            name = f"blocks.{layer}.hook_resid_post"
            for position in range(SEQ):

                def hook(value: torch.Tensor, hook: Any, name: str = name, position: int = position) -> torch.Tensor:
                    value[:, position] = cache[name][:, position]
                    return value

                patched.append(_metric(bridge.run_with_hooks(corrupted, fwd_hooks=[(name, hook)])))
    recorded = [cache[f"blocks.{layer}.hook_resid_post"] for layer in range(LAYERS)]
    return recorded, _normalised(patched, _metric(clean_logits), corrupted_metric)


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=LAYERS, n_embd=32, n_head=4, vocab_size=50, n_positions=16, use_cache=False,
        attn_implementation="eager",  # what TransformerLens's bridge forces: the same kernels on every side
    )  # fmt: skip
    # float64: the bridge computes in its own module tree, whose float32 rounding differs from the model's (a
    # normalised effect 1.7e-5 apart on an AMD EPYC); in float64 every side agrees to about 1e-14
    model = GPT2LMHeadModel(config).double().eval()
    clean = torch.randint(0, 50, (2, SEQ))
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 7) % 50
    with torch.no_grad(), steer.record(model, "transformer.h.*") as rec:
        model(clean)
    ours = [rec[f"transformer.h.{layer}"] for layer in range(LAYERS)]
    result = steer.patch(
        model, clean, corrupted, lambda out: _metric(out.logits), select="transformer.h.*", positions="each",
        batch_size=5,
    )  # fmt: skip
    report = {}
    for peer, (recorded, effects) in {
        "nnsight": nnsight_values(model, clean, corrupted),
        "transformer_lens": lens_values(model, config, clean, corrupted),
    }.items():
        report[peer] = {
            "recording": max(float((a - b).abs().max()) for a, b in zip(ours, recorded, strict=True)),
            "sweep": float((result.effects - effects).abs().max()),
            "effects_span": float(effects.abs().max()),
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
