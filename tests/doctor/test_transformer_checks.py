"""The doctor's transformer checks on the planted runs of issue 24 and their healthy twins, on the tiny pre-LN
decoder (`hookscope.demo.TinyGPT`: d=64, 2 layers, 2 heads), with explicit-softmax and SDPA attention.

Figures of these runs (tiny decoder, AdamW (0.9, 0.95), 10% warmup then cosine over 300 steps): at LR 0.1
without qk-layernorm the layers' max logits pass 1e3 by step 50 (nothing is learned, 4.16); the qk-layernorm
twin stays below 30 and learns (2.1); at LR 3e-2 the heads are sharp (max logit 200-340, entropy near 0) and the
run learns (2.02); at LR 0.3 logits pass 1e3 by step 25. Runs stop early where the issue's onsets allow (the
schedule still spans 300 steps) and record only what the checks read (`transformer_runs.GROUPS`).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from hookscope.demo import TinyGPT, TinyGPTConfig
from hookscope.demo._transformer import repeat_batch
from hookscope.doctor import Finding, Thresholds, diagnose
from hookscope.doctor._series import warmup_length
from hookscope.results import WatchResults
from hookscope.results._results import OPTIMIZER_STATS
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


GAIN, RAMP = 6.0, 10
"""The planted warmup collapse: `blocks.0.attn`'s qk-layernorm gains forced from 1 up to `GAIN` over the first
`RAMP` steps (what a learning rate too high does to them; the LR 1.0 qk-layernorm run gets there by itself, near
the end of its warmup). qk-layernorm bounds the max logit by sqrt(head width) * GAIN**2 = 204."""


class WarmupCollapse:
    """Plant the gain ramp (or not: the healthy twin) and keep, per training forward and head of `blocks.0.attn`, a
    naive reference of its entropy and max logit from the normalized queries and keys (every forward of the
    planted runs is a training forward of one step, every step measured)."""

    def __init__(self, ramp: bool) -> None:
        self.ramp = ramp
        self.entropy: list[list[float]] = []
        self.max_logit: list[list[float]] = []
        self._query = torch.zeros(0)

    def __call__(self, model: TinyGPT) -> None:
        attn = model.blocks[0].attn
        assert attn.q_norm is not None and attn.k_norm is not None
        attn.register_forward_pre_hook(self._force_gains)
        attn.q_norm.register_forward_hook(self._keep_query)
        attn.k_norm.register_forward_hook(self._reference)

    def _force_gains(self, module: nn.Module, args: object) -> None:
        if self.ramp:
            gain = 1 + (GAIN - 1) * min(len(self.entropy) / RAMP, 1.0)
            with torch.no_grad():
                module.q_norm.weight.fill_(gain)
                module.k_norm.weight.fill_(gain)

    def _keep_query(self, module: nn.Module, args: object, output: torch.Tensor) -> None:
        self._query = output.detach().double()

    def _reference(self, module: nn.Module, args: object, output: torch.Tensor) -> None:
        q, k = self._query, output.detach().double()  # (B, heads, T, head width)
        length = q.shape[2]
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        allowed = torch.ones(length, length, dtype=torch.bool).tril()
        p = logits.masked_fill(~allowed, -math.inf).softmax(-1)
        keys = torch.arange(1, length + 1, dtype=torch.float64)  # query i may attend to i + 1 keys
        entropy = -torch.xlogy(p, p).sum(-1)[..., 1:] / keys[1:].log()  # queries with 2+ keys
        self.entropy.append(entropy.mean(dim=(0, 2)).tolist())
        self.max_logit.append(logits.masked_fill(~allowed, -math.inf).amax(dim=(0, 2, 3)).tolist())


def _collapse_onset(entropy: list[list[float]], warmup: int, floor: float, window: int) -> int | None:
    """The first step t whose `window` steps t.. all lie in the warmup and over which every head's median entropy
    is below `floor`, one step and head at a time; then the first of those steps where every head is below it."""
    for t in range(warmup - window + 1):
        medians = [sorted(step[h] for step in entropy[t : t + window])[window // 2] for h in range(len(entropy[0]))]
        if all(m < floor for m in medians):
            return next((s for s in range(t, t + window) if all(e < floor for e in entropy[s])), t)
    return None


@KINDS
def test_every_head_of_a_layer_collapsing_during_warmup_is_found_with_bounded_logits(sdpa: bool) -> None:
    planted = WarmupCollapse(ramp=True)
    faulty = run(sdpa=sdpa, lr=1e-2, qk_layernorm=True, steps=30, schedule_steps=300, plant=planted)  # warmup 30
    thresholds = Thresholds()
    expected = _collapse_onset(planted.entropy, 30, thresholds.attention_entropy_floor, thresholds.window)
    assert expected is not None and expected < RAMP + 5  # the plant collapses the layer early in the warmup
    (collapse,) = faulty.named("attention_entropy_collapse")
    assert (collapse.path, collapse.step, collapse.evidence["corroboration"]) == ("blocks.0.attn", expected, "warmup")
    assert (collapse.evidence["heads_collapsed"], collapse.evidence["warmup_end"]) == (2, 29)
    assert collapse.evidence["max_logit"] == pytest.approx(max(planted.max_logit[expected]), rel=1e-3)
    assert max(max(step) for step in planted.max_logit) < math.sqrt(32) * GAIN**2  # bounded: no logit growth
    assert faulty.named("attention_logit_growth") == [] and faulty.warnings("attention_") == [collapse]
    twin = WarmupCollapse(ramp=False)
    healthy = run(sdpa=sdpa, lr=1e-2, qk_layernorm=True, steps=30, schedule_steps=300, plant=twin)
    assert _collapse_onset(twin.entropy, 30, thresholds.attention_entropy_floor, thresholds.window) is None
    assert healthy.warnings() == []


def _lr(values: list[float]) -> dict[str, dict[str, torch.Tensor]]:
    """Optimizer series of one weight: the learning rates `values`, the other statistics unknown."""
    unknown = torch.full((len(values),), float("nan"), dtype=torch.float64)
    stats = {stat: unknown for stat in OPTIMIZER_STATS} | {"lr": torch.tensor(values, dtype=torch.float64)}
    return {"blocks.0.attn.qkv.weight": stats}


def test_warmup_length_is_the_run_of_rising_learning_rates_from_the_first_step() -> None:
    def length(values: list[float]) -> int | None:
        return warmup_length(WatchResults(steps=torch.arange(len(values)), optimizer=_lr(values)))

    nan = float("nan")
    assert length([0.1, 0.2, 0.3, 0.3, 0.2]) == 3  # linear warmup to the peak, then flat or decaying
    assert length([0.0, 0.5, 1.0, 0.9, 0.8, 5.0, 6.0]) == 3  # a learning rate raised later is no warmup
    assert length([0.1, nan, 0.3, 0.4, 0.1]) == 4  # a step without a known learning rate is passed over
    assert length([0.1, 0.1, 0.2]) == 0 and length([0.3, 0.2]) == 0  # constant or decaying from the start
    assert length([1.0, 1.0 + 1e-9]) == 0  # float noise is no rise
    assert warmup_length(WatchResults(steps=torch.arange(3))) is None  # no optimizer: unknown
    biases = {"0.bias": _lr([0.1, 0.2, 0.3])["blocks.0.attn.qkv.weight"]}
    assert warmup_length(WatchResults(steps=torch.arange(3), optimizer=biases)) is None  # weights only


def _collapse(entropy: list[list[float]], lr: list[float] | None) -> list[Finding]:
    steps = len(entropy)
    stats = {
        "max_logit": torch.full((steps, 2), 20.0, dtype=torch.float64),  # bounded
        "entropy": torch.tensor(entropy, dtype=torch.float64),
        "sink": torch.full((steps, 2), 0.1, dtype=torch.float64),
    }
    results = WatchResults(
        steps=torch.arange(steps) + 100, attention={"blocks.0.attn": stats}, optimizer={} if lr is None else _lr(lr)
    )
    return [f for f in diagnose(results) if f.check == "attention_entropy_collapse"]


def test_entropy_collapse_in_warmup_needs_every_head_within_the_warmup_and_a_known_learning_rate() -> None:
    rising = [0.1 * (i + 1) for i in range(6)] + [0.5] * 6  # steps 100-105 are the warmup
    both = [[0.5, 0.5]] * 2 + [[0.01, 0.02]] * 10  # both heads below 0.05 from step 102
    (finding,) = _collapse(both, rising)
    assert (finding.step, finding.evidence["corroboration"], finding.evidence["warmup_end"]) == (102, "warmup", 105)
    assert finding.evidence["entropy"] == 0.02 and finding.evidence["head"] == 1  # the least collapsed head
    edge = [[0.5, 0.5]] * 4 + [[0.01, 0.02]] * 8  # from step 104: two of the window 103-105, in the warmup
    assert [f.step for f in _collapse(edge, rising)] == [104]
    late = [[0.5, 0.5]] * 5 + [[0.01, 0.02]] * 7  # from step 105: only windows that leave the warmup see it
    assert _collapse(late, rising) == []
    one = [[0.5, 0.5]] * 2 + [[0.01, 0.5]] * 10  # one head of two: a sharp head, no collapse of the layer
    assert _collapse(one, rising) == []
    assert _collapse(both, None) == [] and _collapse(both, [0.5] * 12) == []  # no warmup known, or none


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "sdpa"), [(s, k) for s in (0, 1, 2) for k in (False, True)])
def test_healthy_runs_have_no_loss_spike(seed: int, sdpa: bool) -> None:
    healthy = run(sdpa=sdpa, lr=1e-2, steps=400, seed=seed)
    assert healthy.named("loss_spike") == [] and healthy.warnings() == []


@pytest.mark.slow
@KINDS
def test_a_learning_rate_multiplied_by_100_mid_run_is_a_loss_spike(sdpa: bool) -> None:
    spiked = run(sdpa=sdpa, lr=1e-2, steps=320, schedule_steps=400, lr_jump=(300, 100.0))
    (spike,) = spiked.named("loss_spike")
    assert spike.step is not None and 300 <= spike.step <= 310
    assert spike.evidence["loss_after"] > 1.5 * spike.evidence["loss_before"]  # type: ignore[operator]
    assert spike.evidence["signal"] in ("max_logit", "grad_norm") and 299 <= spike.evidence["signal_step"] <= 310  # type: ignore[operator]


@KINDS
@pytest.mark.parametrize("planted", [True, False], ids=["planted", "clean"])
def test_a_massive_activation_is_found_at_the_first_block_with_its_channel(planted: bool, sdpa: bool) -> None:
    model = TinyGPT(TinyGPTConfig(length=8, sdpa=sdpa))
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
