"""Attention per head, the residual stream and the optimizer series in watch(): checked against references computed
inside the model, on the tiny decoder (explicit softmax and SDPA), transformers' GPT-2 (eager, sdpa), BERT and ViT,
and nn.TransformerEncoder."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hookscope.stats._attention as engine
from hookscope.demo import TinyGPT, TinyGPTConfig, tiny_gpt_optimizer, train_tiny_gpt
from hookscope.demo._transformer import TinyAttention, repeat_batch
from hookscope.doctor import diagnose
from hookscope.doctor._series import warmup_length
from hookscope.results import WatchResults, combine_results
from hookscope.watch import watch
from transformer_runs import NEW_CHECKS

ORIGINALS = (F.scaled_dot_product_attention, F.softmax, torch.softmax, torch.Tensor.softmax)


def _is_restored() -> bool:
    now = (F.scaled_dot_product_attention, F.softmax, torch.softmax, torch.Tensor.softmax)
    return all(a is b for a, b in zip(now, ORIGINALS, strict=True))


class ReferenceAttention(TinyAttention):
    """The tiny attention, keeping per training forward a naive reference of its per-head statistics."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__(config)
        self.reference: list[tuple[list[float], list[float], list[float]]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        with torch.no_grad():
            q, k, _ = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, 2))
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            self.reference.append(_naive(q.double(), k.double()))
        return super().forward(x)


def _naive(q: torch.Tensor, k: torch.Tensor) -> tuple[list[float], list[float], list[float]]:
    """Per head: the largest causal logit, the mean normalised entropy (queries with 2+ keys), the mean first-key
    share, one query at a time."""
    batch, heads, length, width = q.shape
    largest, entropy, sink = [], [], []
    for h in range(heads):
        top, entropies, shares = -math.inf, [], []
        for b in range(batch):
            for i in range(length):
                logits = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(width) for j in range(i + 1)]
                top = max(top, *logits)
                p = torch.tensor(logits, dtype=torch.float64).softmax(0)
                shares.append(float(p[0]))
                if i >= 1:
                    entropies.append(float(-(p * p.log()).sum()) / math.log(i + 1))
        largest.append(top)
        entropy.append(sum(entropies) / len(entropies))
        sink.append(sum(shares) / len(shares))
    return largest, entropy, sink


def _reference_model(sdpa: bool) -> TinyGPT:
    model = TinyGPT(TinyGPTConfig(sdpa=sdpa, layers=2, length=8))
    for block in model.blocks:
        old = block.attn
        block.attn = ReferenceAttention(model.config)
        block.attn.load_state_dict(old.state_dict())
    return model


@pytest.mark.parametrize("sdpa", [False, True], ids=["softmax", "sdpa"])
def test_per_head_statistics_match_a_reference_inside_the_model(sdpa: bool) -> None:
    model = _reference_model(sdpa)
    optimizer = tiny_gpt_optimizer(model, lr=0.1)
    generator = torch.Generator().manual_seed(0)
    with watch(model, optimizer) as w:
        for _ in range(4):  # a high learning rate: logits that grow, heads that sharpen
            ids = repeat_batch(generator, batch=4, length=8)
            loss = F.cross_entropy(model(ids[:, :-1]).reshape(-1, 64), ids[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    results = w.results()
    assert list(results.attention) == ["blocks.0.attn", "blocks.1.attn"]
    for index, block in enumerate(model.blocks):
        stats = results.attention[f"blocks.{index}.attn"]
        expected = torch.tensor([r for r in block.attn.reference], dtype=torch.float64)  # (steps, 3, heads)
        assert stats["max_logit"].shape == (4, 2)
        torch.testing.assert_close(stats["max_logit"], expected[:, 0], rtol=1e-3, atol=0)
        torch.testing.assert_close(stats["entropy"], expected[:, 1], rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(stats["sink"], expected[:, 2], rtol=1e-3, atol=1e-4)
        assert bool(((stats["entropy"] >= 0) & (stats["entropy"] <= 1)).all())
        assert bool((stats["sampled"] == 0).all())
    assert _is_restored()


def test_sampled_calls_are_marked_and_their_max_logit_is_a_lower_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _reference_model(sdpa=True)
    monkeypatch.setattr(engine, "ATTENTION_VALUES", 2 * 7 * 7)  # one batch row of 4 read
    with watch(model) as w:
        ids = repeat_batch(torch.Generator().manual_seed(0), batch=4, length=8)
        model(ids[:, :-1]).sum().backward()
    stats = w.results().attention["blocks.0.attn"]
    reference = torch.tensor(model.blocks[0].attn.reference[0][0], dtype=torch.float64)
    assert torch.allclose(stats["sampled"], torch.full((1, 2), 0.75, dtype=torch.float64))
    assert bool((stats["max_logit"][0] <= reference * (1 + 1e-5)).all())


def test_functions_are_wrapped_only_during_a_measured_forward_and_restored_when_it_raises() -> None:
    model = TinyGPT(TinyGPTConfig(length=8))
    seen: list[bool] = []
    model.blocks[0].register_forward_hook(lambda module, args, output: seen.append(F.softmax is not ORIGINALS[1]))
    ids = repeat_batch(torch.Generator().manual_seed(0), batch=2, length=8)[:, :-1]
    with watch(model) as w:
        model(ids).sum().backward()
        with torch.no_grad():
            model(ids)  # not a training forward: nothing wrapped
        assert _is_restored()
        boom = model.blocks[1].register_forward_pre_hook(lambda module, args: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            model(ids)
        assert _is_restored()
        boom.remove()
    assert seen == [True, False, True] and _is_restored()
    logits = w.results().attention["blocks.0.attn"]["max_logit"]
    assert bool(logits[0].isfinite().all()) and bool(logits[1:].isnan().all())  # what a raised forward saw: not kept


def test_other_threads_calls_pass_through_while_a_forward_is_measured() -> None:
    model = TinyGPT(TinyGPTConfig(length=8))
    ids = repeat_batch(torch.Generator().manual_seed(0), batch=2, length=8)[:, :-1]
    outside: list[torch.Tensor] = []

    def elsewhere(module: nn.Module, args: Any) -> None:  # while the model runs, another thread's softmax
        thread = threading.Thread(target=lambda: outside.append(torch.randn(2, 2, 3, 3).softmax(-1)))
        thread.start()
        thread.join()

    model.blocks[0].register_forward_pre_hook(elsewhere)
    with watch(model) as w:
        model(ids).sum().backward()
    results = w.results()
    assert len(outside) == 1 and list(results.attention) == ["blocks.0.attn", "blocks.1.attn"]
    assert _is_restored()


def test_residual_stream_names_the_largest_value_its_channel_and_token() -> None:
    model = TinyGPT(TinyGPTConfig(length=8))
    ids = repeat_batch(torch.Generator().manual_seed(0), batch=2, length=8)[:, :-1]
    outputs: list[torch.Tensor] = []
    model.blocks[1].register_forward_hook(lambda module, args, output: outputs.append(output.detach().clone()))
    with watch(model) as w:
        model(ids).sum().backward()
    stats = w.results().residual["blocks.1"]
    assert list(w.results().residual) == ["blocks.0", "blocks.1"]
    magnitude = outputs[0].abs()
    _, token, channel = (int(i) for i in torch.unravel_index(magnitude.argmax(), magnitude.shape))
    assert float(stats["max"][0]) == pytest.approx(float(magnitude.max()), rel=1e-6)
    assert (int(stats["channel"][0]), int(stats["token"][0])) == (channel, token)
    assert float(stats["median"][0]) == pytest.approx(float(magnitude.median()), rel=0.05)


def test_optimizer_series_hold_gradient_rms_epsilon_and_the_unscaled_update() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, eps=1e-6)
    x = torch.randn(4, 8)
    with watch(model, optimizer) as w:
        model(x).pow(2).mean().backward()
        grad = model[0].weight.grad.clone()
        before = model[0].weight.detach().clone()
        optimizer.step()
        change = model[0].weight.detach() - before
    stats = w.results().optimizer["0.weight"]
    assert float(stats["grad_rms"][0]) == pytest.approx(float(grad.pow(2).mean().sqrt()), rel=1e-5)
    assert float(stats["update_rms"][0]) == pytest.approx(float(change.pow(2).mean().sqrt()) / 0.5, rel=1e-5)
    assert float(stats["eps"][0]) == pytest.approx(1e-6)
    assert float(stats["lr"][0]) == 0.5


def test_the_learning_rate_series_is_the_one_the_schedule_set_at_each_step() -> None:
    model = TinyGPT(TinyGPTConfig(length=8, sdpa=True))
    optimizer = tiny_gpt_optimizer(model, lr=1e-2)
    with watch(model, optimizer, every=1) as w:
        train_tiny_gpt(model, optimizer, steps=6, schedule_steps=20)  # a warmup of 2 steps, then cosine over 18
    expected = [1e-2 * (s + 1) / 2 if s < 2 else 1e-2 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 18)) for s in range(6)]
    for name, stats in w.results().optimizer.items():
        torch.testing.assert_close(stats["lr"], torch.tensor(expected, dtype=torch.float64), msg=name)


def test_a_state_saved_before_the_learning_rate_was_recorded_resumes_with_it_unknown() -> None:
    model = TinyGPT(TinyGPTConfig(length=8))
    optimizer = tiny_gpt_optimizer(model, lr=1e-2)
    with watch(model, optimizer) as first:
        train_tiny_gpt(model, optimizer, steps=2)
    state = first.state_dict()
    older = state["table"]["optimizer"][..., :3].clone()  # grad_rms, update_rms, eps: the older layout
    state["table"]["optimizer"] = older
    resumed = watch(model, optimizer)
    resumed.load_state_dict(state)
    with resumed:
        train_tiny_gpt(model, optimizer, steps=1)
    stats = resumed.results().optimizer["blocks.0.attn.qkv.weight"]
    assert bool(stats["lr"][:2].isnan().all()) and float(stats["lr"][2]) == 1e-2  # one step: no warmup to speak of
    torch.testing.assert_close(stats["eps"], torch.full((3,), 1e-8, dtype=torch.float64))
    state["table"]["optimizer"] = older[..., :2]
    with pytest.raises(ValueError, match=r"optimizer must have 4 columns \(grad_rms, update_rms, eps, lr"):
        watch(model, optimizer).load_state_dict(state)


def test_attention_residual_and_optimizer_series_survive_save_load_and_combine(tmp_path: Any) -> None:
    model = TinyGPT(TinyGPTConfig(length=8, sdpa=True))
    optimizer = tiny_gpt_optimizer(model, lr=1e-2)
    with watch(model, optimizer) as w:
        train_tiny_gpt(model, optimizer, steps=2)
    results = w.results()
    loaded = WatchResults.load(results.save(tmp_path / "results.safetensors"))
    merged = combine_results([results, results])
    for group in ("attention", "residual", "optimizer"):
        ours = getattr(results, group)
        assert ours, group
        for other in (getattr(loaded, group), getattr(merged, group)):
            assert list(other) == list(ours)
            for name, stats in ours.items():
                for stat, values in stats.items():
                    torch.testing.assert_close(other[name][stat], values, equal_nan=True)


def test_the_attention_group_can_be_left_out() -> None:
    model = TinyGPT(TinyGPTConfig(length=8))
    with watch(model, groups=("activations",)) as w:
        model(repeat_batch(torch.Generator().manual_seed(0), batch=2, length=8)[:, :-1]).sum().backward()
    results = w.results()
    assert results.attention == {} and results.residual == {} and _is_restored()


# ---- real models -------------------------------------------------------------------------------------------------
VOCAB, LENGTH = 50, 12


def _gpt2(implementation: str) -> tuple[nn.Module, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2)
    config._attn_implementation = implementation
    model = GPT2LMHeadModel(config)
    return model, lambda ids: model(input_ids=ids, labels=ids).loss


def _bert() -> tuple[nn.Module, Any]:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=LENGTH,
    )  # fmt: skip
    model = BertForMaskedLM(config)
    return model, lambda ids: model(input_ids=ids, attention_mask=(ids > 2).long(), labels=ids).loss


def _vit() -> tuple[nn.Module, Any]:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3,
    )  # fmt: skip
    model = ViTForImageClassification(config)
    images = torch.randn(4, 3, 8, 8)
    return model, lambda ids: model(pixel_values=images, labels=ids[:, 0] % 3).loss


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))  # type: ignore[no-any-return]


def _encoder() -> tuple[nn.Module, Any]:
    model = Encoder()
    return model, lambda ids: F.cross_entropy(model(ids).reshape(-1, VOCAB), ids.reshape(-1))


REAL = {
    "gpt2-eager": (lambda: _gpt2("eager"), [f"transformer.h.{i}.attn" for i in range(2)]),
    "gpt2-sdpa": (lambda: _gpt2("sdpa"), [f"transformer.h.{i}.attn" for i in range(2)]),
    "bert": (_bert, [f"bert.encoder.layer.{i}.attention.self" for i in range(2)]),
    "vit": (_vit, [f"vit.layers.{i}.attention" for i in range(2)]),
    "transformer-encoder": (_encoder, [f"encoder.layers.{i}.self_attn" for i in range(2)]),
}


@pytest.mark.parametrize("name", list(REAL))
def test_real_models_have_attention_series_for_every_layer_and_a_healthy_run_raises_no_new_finding(name: str) -> None:
    pytest.importorskip("transformers")
    build, expected = REAL[name]
    model, loss_of = build()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min((step + 1) / 10, 1.0))
    generator = torch.Generator().manual_seed(0)
    with watch(model, optimizer, every=1) as w:  # 20 steps, every one measured, the first 10 a linear warmup
        for _ in range(20):
            ids = torch.randint(3, VOCAB, (4, LENGTH), generator=generator)
            loss = loss_of(ids)
            w.log_loss(loss)
            loss.backward()
            optimizer.step()
            warmup.step()
            optimizer.zero_grad()
    results = w.results()
    assert warmup_length(results) == 10  # so the entropy check looks for a collapse within it too
    assert list(results.attention) == expected
    for stats in results.attention.values():
        assert stats["max_logit"].shape == (20, 2) and bool(stats["max_logit"].isfinite().all())
        assert bool(((stats["entropy"] >= 0) & (stats["entropy"] <= 1)).all())
    assert len(results.residual) == 2
    assert [f for f in diagnose(results) if f.check in NEW_CHECKS] == []
    assert _is_restored()


def test_a_resumed_run_keeps_the_attention_series_it_saved() -> None:
    model = TinyGPT(TinyGPTConfig(length=8))
    optimizer = tiny_gpt_optimizer(model, lr=1e-2)
    with watch(model, optimizer) as first:
        train_tiny_gpt(model, optimizer, steps=3)
    before = first.results().attention
    resumed = watch(model, optimizer)
    resumed.load_state_dict(first.state_dict())
    with resumed:
        train_tiny_gpt(model, optimizer, steps=2)
    after = resumed.results()
    assert after.steps.tolist() == [0, 1, 2, 3, 4]
    for path, stats in before.items():
        torch.testing.assert_close(after.attention[path]["max_logit"][:3], stats["max_logit"])
        assert bool(after.attention[path]["max_logit"][3:].isfinite().all())


class SelfAttention(nn.Module):
    def __init__(self, need_weights: bool) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.need_weights = need_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)  # True: not allowed
        return self.attn(x, x, x, attn_mask=mask, need_weights=self.need_weights)[0]  # type: ignore[no-any-return]


def test_multihead_attentions_explicit_and_sdpa_paths_give_the_same_per_head_statistics() -> None:
    x = torch.randn(3, 6, 16)
    found = []
    for need_weights in (True, False):  # True: an explicit softmax over (batch * heads, L, S); False: SDPA
        torch.manual_seed(0)
        model = SelfAttention(need_weights)
        with watch(model) as w:
            model(x).sum().backward()
        found.append(w.results().attention["attn"])
    explicit, fused = found
    assert explicit["max_logit"].shape == (1, 4)
    for stat in ("max_logit", "entropy", "sink"):
        torch.testing.assert_close(explicit[stat], fused[stat], rtol=1e-4, atol=1e-5)
