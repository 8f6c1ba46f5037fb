"""Each check on small results built by hand: the edges of its rules, where a training run would be too slow."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope.doctor import Finding, diagnose
from hookscope.results import WatchResults


def series(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def results_with(steps: int, **fields: object) -> WatchResults:
    return WatchResults(steps=torch.arange(steps), **fields)  # type: ignore[arg-type]


def only(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def grads(**norms: list[float]) -> dict[str, dict[str, torch.Tensor]]:
    return {path: {"norm": series(*v), "nonfinite": torch.zeros(len(v))} for path, v in norms.items()}


def test_gradients_growing_three_decades_over_steps_explode_at_the_layer_that_grew_most() -> None:
    slower = [1.0, 1.0, 1.0, 1.0, 10.0, 20.0, 50.0, 100.0]  # so that no depth ratio passes 1e3
    growing = [1.0, 1.0, 1.0, 10.0, 1e2, 2e3, 5e3, 1e4]
    results = results_with(8, layers={"a": "Linear", "b": "Linear"}, output_grads=grads(a=growing, b=slower))
    (found,) = only(diagnose(results), "exploding_gradients")
    # the median over steps 4..6 (1e2, 2e3, 5e3) is the first window past 1e3x the start (1.0)
    assert (found.path, found.step, found.evidence["across"], found.evidence["ratio"]) == ("a", 4, "steps", 2e3)


def test_one_spike_is_not_a_trend() -> None:
    spiky = [1.0, 1.0, 1.0, 1.0, 1e5, 1.0, 1.0]
    results = results_with(7, layers={"a": "Linear"}, output_grads=grads(a=spiky))
    assert diagnose(results, checks=["exploding_gradients"]) == []
    assert only(diagnose(results, window=1), "exploding_gradients")[0].step == 4


def test_shrinking_gradients_are_vanishing_only_while_the_loss_stalls() -> None:
    shrinking = [1.0, 1.0, 1.0, 1e-2, 1e-4, 1e-4, 1e-4]
    layers = {"a": "Linear", "b": "Linear"}
    converging = results_with(7, layers=layers, output_grads=grads(a=shrinking, b=shrinking), losses=series(*shrinking))
    assert only(diagnose(converging), "vanishing_gradients") == []
    stalled = results_with(7, layers=layers, output_grads=grads(a=shrinking, b=shrinking), losses=series(*[2.0] * 7))
    (found,) = only(diagnose(stalled), "vanishing_gradients")
    assert (found.path, found.step, found.evidence["across"]) == ("a", 3, "steps")
    unknown = results_with(7, layers=layers, output_grads=grads(a=shrinking, b=shrinking))
    assert only(diagnose(unknown), "vanishing_gradients") == []  # no loss: cannot tell from convergence


def test_parameter_gradients_stand_in_when_output_gradients_were_not_recorded() -> None:
    params = {
        "0.weight": {"norm": series(3e-4, 3e-4, 3e-4)},
        "0.bias": {"norm": series(4e-4, 4e-4, 4e-4)},  # combined with the weight: 5e-4
        "1.weight": {"norm": series(1.0, 1.0, 1.0)},
    }
    results = results_with(3, layers={"0": "Linear", "1": "Linear"}, param_grads=params)
    (found,) = only(diagnose(results), "vanishing_gradients")
    assert found.path == "0" and found.evidence["ratio"] == pytest.approx(5e-4)


def ratios(**values: list[float]) -> dict[str, torch.Tensor]:
    return {name: series(*v) for name, v in values.items()}


def test_learning_rate_reads_weights_only_and_skips_frozen_tensors_and_skipped_steps() -> None:
    update = ratios(
        **{"a.weight": [0.2, 0.3, 1e-3], "a.bias": [1.0] * 3, "b.weight": [0.3, 0.4, 1e-3], "c.weight": [0.0] * 3}
    )
    (found,) = only(diagnose(results_with(3, update_ratios=update)), "lr_too_high")
    assert found.step == 0 and found.evidence["weights"] == 2 and found.evidence["max_parameter"] == "b.weight"
    assert (found.evidence["median_ratio"], found.evidence["max_ratio"]) == pytest.approx((0.2, 0.3))  # 3-step medians
    low = ratios(**{"a.weight": [1e-7, 0.0, 1e-7, 1e-7], "b.weight": [1e-7] * 4, "c.weight": [1e-3] * 4})
    (found,) = only(diagnose(results_with(4, update_ratios=low)), "lr_too_low")
    assert found.evidence["fraction"] == pytest.approx(2 / 3)
    assert only(diagnose(results_with(4, update_ratios=low), lr_layer_fraction=0.9), "lr_too_low") == []


def test_one_big_step_is_not_a_learning_rate_too_high() -> None:
    spike = ratios(**{"a.weight": [0.5, 1e-3, 1e-3, 1e-3, 1e-3], "b.weight": [0.5, 1e-3, 1e-3, 1e-3, 1e-3]})
    assert only(diagnose(results_with(5, update_ratios=spike)), "lr_too_high") == []
    twice = ratios(**{"a.weight": [1e-3, 0.5, 0.5, 1e-3, 1e-3], "b.weight": [1e-3, 0.5, 0.5, 1e-3, 1e-3]})
    (found,) = only(diagnose(results_with(5, update_ratios=twice)), "lr_too_high")
    assert found.step == 0 and found.evidence["median_ratio"] == pytest.approx(0.5)  # steps 0-2: median 0.5


def test_one_big_output_layer_of_two_weight_tensors_is_not_most_of_them() -> None:
    # pytorch/examples' reinforce.py (Adam lr 1e-2; CartPole's physics written out instead of gymnasium), as
    # `hookscope run` recorded its first steps: the 2x128 output layer moves by ~0.1 of its norm, the 128x4 input
    # layer by ~0.02; the policy learns (episodes of 499 steps by episode 350)
    reinforce = {"affine1.weight": [0.0288, 0.0186, 0.0190, 0.0157], "affine2.weight": [0.1642, 0.1071, 0.0978, 0.0788]}
    assert only(diagnose(results_with(4, update_ratios=ratios(**reinforce))), "lr_too_high") == []
    three = {**reinforce, "affine3.weight": [0.2, 0.3, 0.2, 0.2]}  # two of three: most of them
    (found,) = only(diagnose(results_with(4, update_ratios=ratios(**three))), "lr_too_high")
    assert found.evidence["fraction"] == pytest.approx(2 / 3) and found.evidence["median_ratio"] >= 0.1


# shaped like pytorch/examples' time_sequence_prediction under LBFGS (issue 27: 0.52 -> 0.0036 -> 0.0011)
LBFGS_LOSSES = [0.52, 0.0086, 0.0036, 0.0021, 0.0017, 0.0015, 0.0014, 0.0013, 0.0012, 0.0011]


@pytest.mark.parametrize(
    ("losses", "reported"),
    [
        (LBFGS_LOSSES, False),  # falls steadily: big steps that work
        ([2.3, 2.2, 2.4, 2.3, 2.5, 2.3, 2.4, 2.2, 2.3, 2.4], True),  # stalled
        ([2.3, 1.5, 1.0, 0.8, 9.0, 30.0, 0.7, 0.5, 0.4, 0.3], True),  # falls overall, but diverges on the way
        ([2.35, 23.6, 15.7, 8.5, 5.2, 7.8, 3.4, 1.3, 0.9, 1.1], True),  # the demo's high-lr: jumps, then falls back
        ([-0.2, -0.5, -0.9, -1.0, -1.2, -1.5, -1.5, -1.8, -2.0, -2.2], True),  # a signed loss: nothing to read
        ([2.3, 1.0, 0.5] + [float("nan")] * 7, True),  # mostly unknown
        (None, True),  # no loss logged: the ratios alone
    ],
    ids=["lbfgs-falls", "stalled", "spike", "jump-at-once", "signed", "unknown", "no-loss"],
)
def test_big_steps_while_the_loss_falls_steadily_are_not_a_learning_rate_too_high(
    losses: list[float] | None, reported: bool
) -> None:
    update = ratios(**{"0.weight": [0.4] * 10, "1.weight": [0.3] * 10})
    results = results_with(10, update_ratios=update, losses=None if losses is None else series(*losses))
    assert bool(only(diagnose(results), "lr_too_high")) is reported
    # the oracle of "falls steadily", by hand: last 3-step median <= half the first, none above the first loss
    if losses is not None and reported is False:
        first, last = sorted(losses[:3])[1], sorted(losses[-3:])[1]
        assert last <= 0.5 * first and all(sorted(losses[i : i + 3])[1] <= losses[0] for i in range(8))


def test_saturation_of_the_output_layer_after_training_is_confidence_not_a_fault() -> None:
    layers = {"0": "Linear", "1": "Tanh", "2": "Linear", "3": "Sigmoid"}
    sat = {"1": {"saturated": series(0.1, 0.1, 0.1, 0.1)}, "3": {"saturated": series(0.0, 0.2, 0.9, 0.95)}}
    assert only(diagnose(results_with(4, layers=layers, activations=sat)), "saturation") == []
    sat["3"] = {"saturated": series(0.9, 0.9, 0.9, 0.9)}  # saturated from the start: a fault
    (found,) = only(diagnose(results_with(4, layers=layers, activations=sat)), "saturation")
    assert found.path == "3" and found.step == 0
    relu6 = {"0": "Linear", "1": "ReLU6", "2": "Linear"}
    off = {"1": {"saturated": series(0.6, 0.6, 0.6)}}  # a ReLU6 at 0 is off, not saturated
    assert only(diagnose(results_with(3, layers=relu6, activations=off)), "saturation") == []


def test_dead_units_are_read_at_relu_family_layers_only() -> None:
    layers = {"0": "Linear", "1": "GELU", "2": "Linear"}
    activity = {"0": torch.zeros(4), "1": series(0.0, 0.0, 0.5, math.nan), "2": torch.zeros(1)}
    (found,) = only(diagnose(results_with(5, layers=layers, unit_activity=activity)), "dead_units")
    assert (found.path, found.severity, found.evidence["dead"], found.evidence["units"]) == ("1", "warning", 2, 3)
    results = results_with(5, layers=layers, unit_activity=activity)
    assert only(diagnose(results, dead_unit_fraction=0.7), "dead_units") == []
    results.activations = {"1": {"nonfinite": series(0.0, 0.0, 12.0, 0.0, 0.0)}}
    assert only(diagnose(results), "dead_units") == []  # NaN is never > 0: inactivity says nothing then


def test_mostly_dead_units_are_reported_with_their_count_as_in_the_demo() -> None:
    # the demo's act3 after 8 epochs: 26 of 64 units active 0.1-0.9% of the time, none exactly never
    activity = torch.cat([torch.linspace(0.001, 0.009, 26), torch.linspace(0.2, 0.8, 38)])
    layers = {"fc1": "Linear", "act3": "ReLU", "hf": "GELUActivation"}
    results = results_with(45, layers=layers, unit_activity={"act3": activity, "hf": activity})
    found = only(diagnose(results), "dead_units")
    assert [(f.path, f.severity) for f in found] == [("act3", "warning"), ("hf", "warning")]
    assert found[0].message.startswith("26 of 64 units (41%) were active (> 0) < 1% of the time over 45")
    assert (found[0].evidence["dead"], found[0].evidence["never"], found[0].evidence["input_layer"]) == (26, 0, "fc1")
    assert only(diagnose(results, dead_unit_activity=0.001), "dead_units") == []  # none below 0.1%


def test_symmetry_counts_only_once_training_moved_the_layer() -> None:
    layers = {"0": "Linear", "1": "Linear"}
    activity = {"0": torch.ones(10), "1": torch.ones(4)}
    identical = {"0": 10, "1": 2}
    before = results_with(1, layers=layers, unit_activity=activity, identical_units=identical)
    assert only(diagnose(before), "symmetry") == []
    moved = {"0.weight": series(0.0, 1e-3), "1.weight": series(0.0, 0.0)}
    after = results_with(2, layers=layers, unit_activity=activity, identical_units=identical, update_ratios=moved)
    (found,) = only(diagnose(after), "symmetry")  # "1" was never updated (frozen): not judged
    assert (found.path, found.severity, found.evidence["fraction"]) == ("0", "error", 1.0)
    partial = results_with(3, layers=layers, unit_activity=activity, identical_units={"0": 2})
    assert only(diagnose(partial), "symmetry")[0].severity == "warning"
    assert only(diagnose(partial, identical_unit_fraction=0.5), "symmetry") == []


def stds(**values: float) -> dict[str, dict[str, torch.Tensor]]:
    return {path: {"std": series(v, v)} for path, v in values.items()}


def test_bad_init_spares_a_small_head_and_restarts_after_normalization() -> None:
    head = {"0": "Linear", "1": "ReLU", "2": "Linear"}
    small_head = results_with(2, layers=head, activations=stds(**{"0": 1.0, "1": 0.6, "2": 1e-4}))
    assert only(diagnose(small_head), "bad_init") == []
    normed = {"0": "Linear", "1": "Linear", "2": "LayerNorm", "3": "Linear", "4": "Linear"}
    values = {"0": 1e-3, "1": 1e-2, "2": 1.0, "3": 3.0, "4": 2.5}  # 2.5e3x from "0", but the norm rescaled
    assert only(diagnose(results_with(2, layers=normed, activations=stds(**values))), "bad_init") == []
    values["1"] = 1.5
    (found,) = only(diagnose(results_with(2, layers=normed, activations=stds(**values))), "bad_init")
    assert (found.path, found.evidence["direction"], found.evidence["from_layer"]) == ("1", "blow-up", "0")


def test_bad_init_is_judged_at_step_zero_only() -> None:
    layers = {"0": "Linear", "1": "Linear", "2": "Linear"}
    collapsed = stds(**{"0": 1.0, "1": 1e-2, "2": 1e-4})
    assert only(diagnose(results_with(2, layers=layers, activations=collapsed)), "bad_init")[0].path == "2"
    late = WatchResults(steps=torch.tensor([100, 101]), layers=layers, activations=collapsed)
    assert only(diagnose(late), "bad_init") == []


def test_unobserved_layers_are_listed_as_info() -> None:
    reason = "never fired: MultiheadAttention uses out_proj's weight directly; watch the attention module"
    results = results_with(1, layers={"attn.out_proj": "Linear"}, unobserved={"attn.out_proj": reason})
    (found,) = diagnose(results)
    assert (found.check, found.severity, found.path, found.advice) == ("unobserved", "info", "attn.out_proj", reason)
    assert diagnose(results, min_severity="warning") == []


def test_empty_results_have_no_findings() -> None:
    assert diagnose(WatchResults()) == []


values = st.sampled_from([0.0, -1.0, 1e-9, 1e-3, 0.3, 0.99, 1.0, 7.0, 1e6, math.nan, math.inf])
kinds = st.sampled_from(["Linear", "ReLU", "Tanh", "LayerNorm", "Sigmoid", "ReLU6"])


@st.composite
def arbitrary_results(draw: st.DrawFn) -> WatchResults:
    steps = draw(st.integers(0, 6))
    paths = [f"l{i}" for i in range(draw(st.integers(0, 4)))]
    row = st.lists(values, min_size=steps, max_size=steps).map(lambda v: torch.tensor(v, dtype=torch.float32))
    stat = st.dictionaries(st.sampled_from(["std", "saturated", "nonfinite"]), row, max_size=3)
    return WatchResults(
        steps=torch.arange(steps),
        layers={p: draw(kinds) for p in paths},
        activations={p: draw(stat) for p in paths},
        output_grads={p: {"norm": draw(row), "nonfinite": draw(row)} for p in paths if draw(st.booleans())},
        param_grads={f"{p}.weight": {"norm": draw(row)} for p in paths if draw(st.booleans())},
        update_ratios={f"{p}.{n}": draw(row) for p in paths for n in ("weight", "bias") if draw(st.booleans())},
        losses=draw(st.none() | row),
        unit_activity={p: draw(row) for p in paths if draw(st.booleans())},
        identical_units={p: draw(st.integers(0, 8)) for p in paths if draw(st.booleans())},
    )


@settings(max_examples=150, deadline=None)
@given(arbitrary_results())
def test_any_results_give_ranked_unique_findings_without_crashing(results: WatchResults) -> None:
    findings = diagnose(results)
    assert len({f.key for f in findings}) == len(findings)
    ranks = [["error", "warning", "info"].index(f.severity) for f in findings]
    assert ranks == sorted(ranks)
    assert all(f.path is None or f.path in results.layers for f in findings)


def test_gradients_across_depth_are_compared_within_a_kind_of_layer() -> None:
    layers = {"enc.0.query": "Linear", "enc.0.norm": "LayerNorm", "enc.1.query": "Linear", "enc.1.norm": "LayerNorm"}
    layers["classifier"] = "Linear"
    healthy = grads(
        **{"enc.0.query": [2e-5] * 3, "enc.0.norm": [3e-4] * 3, "enc.1.query": [1e-5] * 3, "enc.1.norm": [2e-4] * 3},
        classifier=[1.0] * 3,
    )  # queries and norms far below the classifier, as in a healthy BERT or ViT: like their own kind
    assert only(diagnose(results_with(3, layers=layers, output_grads=healthy)), "vanishing_gradients") == []
    healthy["enc.0.query"] = {"norm": series(1e-9, 1e-9, 1e-9), "nonfinite": torch.zeros(3)}
    (found,) = only(diagnose(results_with(3, layers=layers, output_grads=healthy)), "vanishing_gradients")
    assert (found.path, found.evidence["reference"], found.evidence["kind"]) == (
        "enc.0.query", "enc.1.query", "Linear enc.*.query"
    )  # fmt: skip
    assert found.evidence["ratio"] == pytest.approx(1e-4)


def test_vanishing_is_reported_only_where_the_weights_stop_learning() -> None:
    layers = {str(i): "ReLU" if i % 2 else "Linear" for i in range(7)}
    values = {"0": 1e-8, "1": 1e-8, "2": 1e-6, "3": 1e-6, "4": 1e-2, "5": 1e-2, "6": 1.0}
    norms = grads(**{path: [value] * 4 for path, value in values.items()})
    # past 1e3x below their kind's layer nearest the loss ("6" for Linear, "5" for ReLU): 0, 2 and 1, 3

    def vanishing(typical: float = 1e-3, **ratios: float) -> list[str]:
        update = {f"{p}.weight": series(*[ratios.get(p, typical)] * 4) for p in ("0", "2", "4", "6")}
        results = results_with(4, layers=layers, output_grads=norms, update_ratios=update)
        return [f.path for f in only(diagnose(results), "vanishing_gradients") if f.evidence["across"] == "depth"]

    assert vanishing() == []  # Adam moves every weight alike: nothing stalls
    assert vanishing(**{"0": 1e-7}) == ["1"]  # below lr_low_ratio: layer 0 and the ReLU after it stall
    assert vanishing(**{"2": 1e-7}) == ["3"]
    assert vanishing(0.1, **{"2": 0.1 / 2e3}) == ["3"]  # 2000x below the model's median weight: stalls
    assert vanishing(0.1, **{"2": 0.1 / 5e2}) == []  # 500x below, above lr_low_ratio: still learns
    without = results_with(4, layers=layers, output_grads=norms)  # no optimizer: nothing says it learns
    assert only(diagnose(without), "vanishing_gradients")[0].path == "3"


def test_steps_after_a_nan_are_not_read_as_a_gradient_trend() -> None:
    falling = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # zero gradients once everything is NaN
    results = results_with(
        7,
        layers={"0": "Linear", "1": "Linear"},
        output_grads=grads(**{"0": falling, "1": falling}),
        losses=series(2.0, 2.0, 2.0, 2.0, float("nan"), float("nan"), float("nan")),
    )
    assert only(diagnose(results), "vanishing_gradients") == []
    results.losses = series(*[2.0] * 7)  # the same collapse with a finite, stalled loss is a trend
    assert only(diagnose(results), "vanishing_gradients")[0].evidence["across"] == "steps"
