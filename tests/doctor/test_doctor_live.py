"""LiveDoctor: periodic diagnosis during training that reports (and warns about) each finding once."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from hookscope.doctor import DiagnosisWarning, Finding, LiveDoctor, Thresholds
from hookscope.results import WatchResults


class Scripted:
    """A check that returns whatever findings the test puts in `now`."""

    def __init__(self) -> None:
        self.now: list[Finding] = []
        self.__name__ = "scripted"

    def __call__(self, results: WatchResults, thresholds: Thresholds) -> list[Finding]:
        return list(self.now)


def make(path: str | None, severity: str = "warning", step: int = 0, value: float = 1.0) -> Finding:
    return Finding("scripted", severity, path, step, f"value {value}", {"value": value}, "fix it")  # type: ignore[arg-type]


RESULTS = WatchResults(steps=torch.arange(2))


def test_each_finding_is_reported_once_and_again_only_when_it_gets_worse() -> None:
    check = Scripted()
    doctor = LiveDoctor(checks=[check])
    assert doctor.update(RESULTS) == []
    check.now = [make("a", step=3)]
    assert [f.path for f in doctor.update(RESULTS)] == ["a"]
    check.now = [make("a", step=9, value=7.0), make("b", step=9)]  # "a" again with new figures: quiet
    assert [f.path for f in doctor.update(RESULTS)] == ["b"]
    assert doctor.update(RESULTS) == []
    check.now = [make("a", "error", step=12), make("b")]
    assert [(f.path, f.severity) for f in doctor.update(RESULTS)] == [("a", "error")]
    assert [(f.path, f.severity, f.step) for f in doctor.reported] == [("a", "error", 12), ("b", "warning", 9)]
    doctor.reset()
    assert [f.path for f in doctor.update(RESULTS)] == ["a", "b"]


def test_info_is_ignored_by_default() -> None:
    check = Scripted()
    check.now = [make("a", "info")]
    assert LiveDoctor(checks=[check]).update(RESULTS) == []
    assert len(LiveDoctor(checks=[check], min_severity="info").update(RESULTS)) == 1


def test_warn_emits_one_warning_per_new_finding_pointing_at_the_caller() -> None:
    check = Scripted()
    check.now = [make("net.2", step=5)]
    doctor = LiveDoctor(checks=[check])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doctor.update(RESULTS, warn=True)
        doctor.update(RESULTS, warn=True)
    assert len(caught) == 1 and caught[0].category is DiagnosisWarning
    assert str(caught[0].message) == "warning: [scripted] 'net.2' at step 5: value 1.0 -> fix it"
    assert caught[0].filename == __file__


def test_state_dict_survives_json_so_a_resumed_run_does_not_warn_again() -> None:
    check = Scripted()
    check.now = [make("a"), make(None, "error")]
    doctor = LiveDoctor(checks=[check])
    doctor.update(RESULTS)
    state = json.loads(json.dumps(doctor.state_dict()))
    resumed = LiveDoctor(checks=[check])
    resumed.load_state_dict(state)
    assert resumed.update(RESULTS) == []
    assert resumed.reported == doctor.reported
    with pytest.raises(ValueError, match="state must be a LiveDoctor.state_dict\\(\\) \\(version 1\\), got"):
        resumed.load_state_dict({"reported": []})


def test_arguments_are_checked_when_the_doctor_is_built() -> None:
    with pytest.raises(ValueError, match="checks must name a registered check, got 'nan'"):
        LiveDoctor(checks=["nan"])
    with pytest.raises(ValueError, match="window must be a positive int, got 0"):
        LiveDoctor(window=0)
    with pytest.raises(ValueError, match="min_severity must be one of"):
        LiveDoctor(min_severity="all")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="thresholds must be a hookscope.doctor.Thresholds or None"):
        LiveDoctor(thresholds=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="results must be a hookscope WatchResults"):
        LiveDoctor().update([])  # type: ignore[arg-type]
