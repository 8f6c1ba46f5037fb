"""The doctor's surface: findings, their ranking and text, thresholds, the check registry and its errors."""

from __future__ import annotations

import doctest
import importlib
import json
from collections.abc import Iterator

import pytest
import torch

from hookscope.doctor import (
    Finding,
    Thresholds,
    diagnose,
    format_findings,
    list_checks,
    register_check,
    unregister_check,
)
from hookscope.results import WatchResults

BUILTIN = [
    "nonfinite_forward",
    "nonfinite_backward",
    "bad_init",
    "symmetry",
    "lr_too_high",
    "lr_too_low",
    "exploding_gradients",
    "vanishing_gradients",
    "dead_units",
    "saturation",
    "unobserved",
    "attention_logit_growth",
    "attention_entropy_collapse",
    "adam_epsilon_too_large",
    "loss_spike",
    "massive_activation",
    "attention_sink",
]


def finding(check: str = "custom", severity: str = "warning", path: str | None = "a", step: int | None = 0) -> Finding:
    return Finding(check, severity, path, step, f"{check} message", {"x": 1.0}, f"{check} advice")  # type: ignore[arg-type]


@pytest.fixture
def results() -> WatchResults:
    layers = {"a": "Linear", "b": "ReLU", "c": "Linear"}
    return WatchResults(steps=torch.arange(3), layers=layers, activations={p: {} for p in layers})


@pytest.fixture
def registered() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        unregister_check(name)


def test_finding_validates_and_serializes() -> None:
    with pytest.raises(ValueError, match=r"severity must be one of \('error', 'warning', 'info'\), got 'fatal'"):
        finding(severity="fatal")
    with pytest.raises(ValueError, match="check must be a non-empty str naming the check, got ''"):
        finding(check="")
    item = Finding("c", "error", None, 3, "m", {"v": float("nan"), "n": 2}, "a")
    assert item.key == ("c", None)
    assert json.loads(json.dumps(item.to_dict()))["evidence"] == {"v": None, "n": 2}
    assert str(item) == "error: [c] model at step 3: m"


def test_format_findings_is_a_short_numbered_list() -> None:
    items = [finding("nonfinite_forward", "error", "net.3", 12), finding("lr_too_high", path=None), finding(step=None)]
    assert format_findings(items) == (
        "hookscope doctor: 3 findings (1 error, 2 warnings)\n"
        " 1. ERROR   nonfinite_forward 'net.3' step 12: nonfinite_forward message\n"
        "    -> nonfinite_forward advice\n"
        " 2. WARNING lr_too_high (model) step 0: lr_too_high message\n"
        "    -> lr_too_high advice\n"
        " 3. WARNING custom 'a': custom message\n"
        "    -> custom advice"
    )
    assert format_findings(items, limit=1).splitlines()[-1] == "    ... and 2 more"
    assert format_findings([]) == "hookscope doctor: no findings."
    with pytest.raises(ValueError, match="limit must be a positive int or None, got 0"):
        format_findings(items, limit=0)
    with pytest.raises(ValueError, match=r"width must be an int >= 40 or None \(the terminal's width\), got 20"):
        format_findings(items, width=20)


@pytest.mark.parametrize("width", [80, 100, 160])
def test_format_findings_fits_the_width_and_names_the_root(width: int) -> None:
    path = "vit.encoder.layer.11.attention.attention.query_projection_of_a_long_name." * 3 + "weight_17"
    items = [
        Finding(
            "vanishing_gradients", "warning", path, 4, f"gradient norm here is 1e-05x that of {path!r}", {}, "a " * 90
        ),
        Finding("bad_init", "warning", "", 0, "std falls", {}, "init"),
    ]
    text = format_findings(items, width=width)
    assert max(map(len, text.splitlines())) <= width
    assert " 2. WARNING bad_init (root) step 0: std falls" in text and "''" not in text
    assert "weight_17" in text and "vit." in text  # both ends of the shortened path, its number whole
    words = text.split()
    assert words.count("a") == 90  # the advice is wrapped, not cut
    assert str(items[1]) == "warning: [bad_init] (root) at step 0: std falls"


def test_findings_rank_by_severity_then_step_then_check_then_model_order(
    results: WatchResults, registered: list[str]
) -> None:
    planted = [
        finding("zz_late", "warning", "a", 5),
        finding("zz_info", "info", "a", 0),
        finding("symmetry", "warning", "c", 2),
        finding("bad_init", "warning", "c", 2),
        finding("bad_init", "warning", "a", 2),
        finding("zz_error", "error", "c", 9),
    ]
    register_check("zz_planted", lambda r, t: planted)
    registered.append("zz_planted")
    order = [(f.check, f.path) for f in diagnose(results, checks=["zz_planted"])]
    assert order == [
        ("zz_error", "c"),
        ("bad_init", "a"),
        ("bad_init", "c"),
        ("symmetry", "c"),
        ("zz_late", "a"),
        ("zz_info", "a"),
    ]


def test_one_finding_per_check_and_layer_keeps_the_most_important(results: WatchResults) -> None:
    def twice(r: WatchResults, t: Thresholds) -> list[Finding]:
        return [finding(step=4), finding(severity="error", step=6), finding(step=1)]

    (kept,) = diagnose(results, checks=[twice])
    assert (kept.severity, kept.step) == ("error", 6)


def test_the_registry_lists_adds_replaces_and_removes_checks(results: WatchResults, registered: list[str]) -> None:
    assert list_checks() == BUILTIN
    register_check("always", lambda r, t: [finding("always")])
    registered.append("always")
    assert list_checks() == [*BUILTIN, "always"]
    assert [f.check for f in diagnose(results)] == ["always"]
    with pytest.raises(ValueError, match="name must not be a registered check, got 'always'; pass replace=True"):
        register_check("always", lambda r, t: [])
    register_check("always", lambda r, t: [], replace=True)
    assert diagnose(results) == []
    with pytest.raises(ValueError, match="name must be a non-empty str, got ''"):
        register_check("", lambda r, t: [])
    with pytest.raises(TypeError, match="check must be callable as check\\(results, thresholds\\), got 3"):
        register_check("three", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must name a registered check, got 'nope'"):
        unregister_check("nope")


def test_checks_and_disable_pick_what_runs(results: WatchResults) -> None:
    seen: list[str] = []

    def spy(r: WatchResults, t: Thresholds) -> list[Finding]:
        seen.append("spy")
        return [finding("spy")]

    assert [f.check for f in diagnose(results, checks={"spy": spy})] == ["spy"]
    assert [f.check for f in diagnose(results, checks=[spy, "dead_units"])] == ["spy"]
    assert diagnose(results, checks={"spy": spy}, disable=["spy"]) == []
    assert seen == ["spy", "spy"]
    assert diagnose(results, checks="dead_units", disable="dead_units") == []


def test_unknown_names_list_the_closest(results: WatchResults) -> None:
    with pytest.raises(
        ValueError, match=r"checks must name a registered check, got 'dead_unit'. Closest: 'dead_units'"
    ):
        diagnose(results, checks=["dead_unit"])
    with pytest.raises(
        ValueError, match=r"disable must name a registered check, got 'saturate'. Closest: 'saturation'"
    ):
        diagnose(results, disable=["saturate"])
    with pytest.raises(ValueError, match=r"threshold names must be fields of Thresholds, got 'dead_units'\. Closest: "):
        diagnose(results, dead_units=0.3)
    with pytest.raises(TypeError, match="checks entries must be check names or callables, got 3"):
        diagnose(results, checks=[3])  # type: ignore[list-item]


def test_bad_arguments_and_bad_checks_fail_clearly(results: WatchResults) -> None:
    with pytest.raises(
        TypeError, match=r"results must be a WatchResults, got \{'steps': \[\]\}; use the results of watch\(model\)"
    ):
        diagnose({"steps": []})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="thresholds must be a Thresholds or None, got"):
        diagnose(results, thresholds={"window": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_severity must be one of .*, got 'debug'"):
        diagnose(results, min_severity="debug")  # type: ignore[arg-type]

    def broken(r: WatchResults, t: Thresholds) -> list[Finding]:
        raise KeyError("layer")

    with pytest.raises(RuntimeError, match="check 'broken' failed on these results: KeyError") as caught:
        diagnose(results, checks=[broken])
    assert isinstance(caught.value.__cause__, KeyError)
    with pytest.raises(TypeError, match="check 'strings' must return Finding objects, got 'oops'"):
        diagnose(results, checks={"strings": lambda r, t: ["oops"]})


def test_thresholds_have_documented_defaults_and_reject_bad_values() -> None:
    defaults = Thresholds()
    assert (defaults.grad_depth_ratio, defaults.lr_high_ratio, defaults.lr_low_ratio) == (1e3, 0.1, 1e-5)
    assert defaults.replace(window=5).window == 5 and defaults.window == 3
    for name in vars(defaults):
        assert f"{name}:" in (Thresholds.__doc__ or ""), name
    with pytest.raises(ValueError, match="window must be a positive int, got 0"):
        Thresholds(window=0)
    with pytest.raises(ValueError, match="dead_unit_fraction must be a fraction in \\(0, 1\\], got 1.5"):
        Thresholds(dead_unit_fraction=1.5)
    with pytest.raises(ValueError, match="saturation_fraction must be a finite number > 0, got nan"):
        Thresholds(saturation_fraction=float("nan"))
    with pytest.raises(ValueError, match="grad_depth_ratio must be a factor > 1, got 0.5"):
        Thresholds(grad_depth_ratio=0.5)
    with pytest.raises(ValueError, match="lr_low_ratio must be below lr_high_ratio, got 0.1 >= 0.01"):
        Thresholds(lr_low_ratio=0.1, lr_high_ratio=0.01)


def test_docstring_examples_run() -> None:
    for name in ("_diagnose", "_finding", "_live"):
        result = doctest.testmod(importlib.import_module(f"hookscope.doctor.{name}"))
        assert result.attempted > 0 and result.failed == 0, name
