"""The doctor's transformer checks on the planted runs of issue 24 and their healthy twins, on the tiny pre-LN
decoder (`hookscope.demo.TinyGPT`: d=64, 2 layers, 2 heads), with explicit-softmax and SDPA attention.

Figures of these runs (tiny decoder, AdamW (0.9, 0.95), 10% warmup then cosine over 300 steps): at LR 0.1
without qk-layernorm the layers' max logits pass 1e3 by step 50 (nothing is learned, 4.16); the qk-layernorm
twin stays below 30 and learns (2.1); at LR 3e-2 the heads are sharp (max logit 200-340, entropy near 0) and the
run learns (2.02); at LR 0.3 logits pass 1e3 by step 25. Runs stop early where the issue's onsets allow (the
schedule still spans 300 steps) and record only what the checks read (`transformer_runs.GROUPS`).
"""

from __future__ import annotations

import pytest
import torch

from hookscope.demo import TinyGPT, TinyGPTConfig
from hookscope.demo._transformer import repeat_batch
from hookscope.doctor import Thresholds, diagnose
from hookscope.results import WatchResults
from hookscope.watch import watch
from transformer_runs import NEW_CHECKS, run

KINDS = pytest.mark.parametrize("sdpa", [False, True], ids=["softmax", "sdpa"])


@pytest.mark.slow
@KINDS
def test_lr_0_1_without_qk_layernorm_grows_attention_logits_and_the_live_doctor_says_so(sdpa: bool) -> None:
    faulty = run(sdpa=sdpa, lr=0.1, steps=80, schedule_steps=300, doctor_every=10)
    growth = faulty.named("attention_logit_growth")
    assert {f.path for f in growth} == {"blocks.0.attn", "blocks.1.attn"}
    assert all(f.step is not None and f.step <= 200 for f in growth)
    assert all(isinstance(f.evidence["head"], int) and f.evidence["max_logit"] > 1e3 for f in growth)
    assert faulty.live["attention_logit_growth"] < 80  # raised while the run went
    assert faulty.named("loss_spike") == [] and sum(faulty.losses[-10:]) / 10 > 4.0  # nothing learned
    twin = run(sdpa=sdpa, lr=0.1, qk_layernorm=True, steps=80, schedule_steps=300)
    assert twin.warnings("attention_") == [] and twin.warnings() == []


@pytest.mark.slow
@KINDS
def test_lr_3e_2_sharp_but_healthy_heads_raise_nothing(sdpa: bool) -> None:
    sharp = run(sdpa=sdpa, lr=3e-2, steps=200, schedule_steps=300)
    entropy = torch.cat([s["entropy"][-20:] for s in sharp.results.attention.values()], dim=1)
    assert float(entropy.amin()) < 0.05  # heads attend to one key ...
    assert sum(sharp.losses[-10:]) / 10 < 2.3  # ... and the run learns
    assert sharp.warnings() == []


@pytest.mark.slow
@KINDS
def test_lr_0_3_collapses_attention_entropy(sdpa: bool) -> None:
    faulty = run(sdpa=sdpa, lr=0.3, steps=60, schedule_steps=300)
    collapse = faulty.named("attention_entropy_collapse")
    assert collapse and all(f.path in ("blocks.0.attn", "blocks.1.attn") for f in collapse)
    assert all(f.step is not None and f.step <= 120 for f in collapse)
    assert all(f.evidence["heads_collapsed"] >= 1 for f in collapse)


@KINDS
def test_a_loss_far_below_adams_epsilon_is_found_and_a_small_epsilon_is_not(sdpa: bool) -> None:
    stalled = run(sdpa=sdpa, lr=1e-2, steps=30, loss_scale=1e-7, schedule_steps=300)
    (finding,) = stalled.named("adam_epsilon_too_large")
    assert finding.step is not None and finding.step <= 30 and finding.evidence["rms_over_eps"] < 0.1
    twin = run(sdpa=sdpa, lr=1e-2, eps=1e-15, steps=30, loss_scale=1e-7, schedule_steps=300)
    assert twin.named("adam_epsilon_too_large") == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_runs_have_no_loss_spike(seed: int) -> None:
    healthy = run(sdpa=seed != 0, lr=1e-2, steps=400, seed=seed)
    assert healthy.named("loss_spike") == [] and healthy.warnings() == []


@pytest.mark.slow
@KINDS
def test_a_learning_rate_multiplied_by_100_mid_run_is_a_loss_spike(sdpa: bool) -> None:
    spiked = run(sdpa=sdpa, lr=1e-2, steps=320, schedule_steps=400, lr_jump=(300, 100.0))
    (spike,) = spiked.named("loss_spike")
    assert spike.step is not None and 300 <= spike.step <= 310
    assert spike.evidence["loss_after"] > 1.5 * spike.evidence["loss_before"]  # type: ignore[operator]
    assert spike.evidence["signal"] in ("max_logit", "grad_norm") and 299 <= spike.evidence["signal_step"] <= 310  # type: ignore[operator]


@pytest.mark.parametrize("planted", [True, False], ids=["planted", "clean"])
def test_a_massive_activation_is_found_at_the_first_block_with_its_channel(planted: bool) -> None:
    model = TinyGPT(TinyGPTConfig(length=8))
    if planted:

        def plant(module: torch.nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
            output = output.clone()
            output[:, 0, 5] += 2000.0
            return output

        model.blocks[0].register_forward_hook(plant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    with watch(model, optimizer) as w:
        for _ in range(3):
            model(repeat_batch(generator, batch=4, length=8)[:, :-1]).logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    found = [f for f in diagnose(w.results()) if f.check == "massive_activation"]
    if not planted:
        assert found == []
        return
    (finding,) = found
    assert (finding.path, finding.severity, finding.step) == ("blocks.0", "info", 0)
    assert (finding.evidence["channel"], finding.evidence["token"]) == (5, 0)


def _attention(max_logit: list[float], entropy: list[float], sink: list[float]) -> dict[str, torch.Tensor]:
    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64)[:, None].repeat(1, 2)

    return {"max_logit": column(max_logit), "entropy": column(entropy), "sink": column(sink)}


def test_low_entropy_alone_is_no_fault_and_a_sink_is_only_information() -> None:
    steps = 12
    sharp = _attention([2.0 + i for i in range(steps)], [0.01] * steps, [0.9] * steps)
    results = WatchResults(steps=torch.arange(steps), attention={"blocks.0.attn": sharp})
    findings = [f for f in diagnose(results) if f.check in NEW_CHECKS]
    assert [(f.check, f.severity, f.path) for f in findings] == [("attention_sink", "info", "blocks.0.attn")]
    grown = _attention([2.0 * 3**i for i in range(steps)], [0.5] * 4 + [0.01] * (steps - 4), [0.1] * steps)
    results = WatchResults(steps=torch.arange(steps), attention={"blocks.0.attn": grown})
    checks = {f.check: f for f in diagnose(results) if f.check in NEW_CHECKS}
    assert set(checks) == {"attention_logit_growth", "attention_entropy_collapse"}
    # the windowed median passes 1e3 over steps 5-7 (4374 at 7); the last step ten times below that is 4 (162)
    assert checks["attention_logit_growth"].step == 5 and checks["attention_entropy_collapse"].step == 5


def test_the_new_thresholds_are_checked() -> None:
    with pytest.raises(ValueError, match="attention_entropy_floor must be a fraction"):
        Thresholds(attention_entropy_floor=2.0)
    with pytest.raises(ValueError, match="loss_spike_window must be a positive int"):
        Thresholds(loss_spike_window=0)
    with pytest.raises(ValueError, match="loss_spike_ratio must be a factor > 1"):
        Thresholds(loss_spike_ratio=0.5)
