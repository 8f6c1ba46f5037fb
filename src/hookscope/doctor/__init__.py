"""Diagnosis: what is wrong with a training run, at which layer, since which step, and what to do about it.

`diagnose(results)` runs pure checks over the `WatchResults` that `watch()` collected (`hookscope.watch`) and
returns ranked `Finding`s (check, severity, layer path, step, evidence, advice); `format_findings` prints them
as a short list, first in the report; a notebook shows `diagnose`'s `Findings` as the same list in HTML
(`findings_html`). Built-in checks: non-finite values with provenance (`_nonfinite.py`),
exploding/vanishing gradients across depth and over steps (`_gradients.py`), learning rate too high/low from
update-to-weight ratios (`_learning_rate.py`), dead ReLU units, saturated tanh/sigmoid outputs and unbroken
symmetry (`_units.py`), bad initialization at step 0 and unobserved layers (`_init.py`), and how transformers
fail (`_transformers.py`: attention-logit growth, entropy collapse, Adam's epsilon too large, loss spikes, massive
activations, attention sinks). Every number they
compare against is a field of `Thresholds`; `register_check(name, fn)` adds a check, `diagnose(checks=...,
disable=...)` picks them per call. `LiveDoctor` re-diagnoses periodically during training and returns (or
warns about) each finding once: it is what `watch(..., doctor=True)` drives. Nothing here registers hooks or
touches a device: it reads CPU tensors already collected.
"""

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from ._diagnose import Check, list_checks, register_check, unregister_check
from ._diagnose import diagnose as diagnose
from ._finding import DiagnosisWarning, Finding, Findings
from ._finding import format_findings as format_findings
from ._live import LiveDoctor
from ._thresholds import Thresholds

__all__ = [
    "Check",
    "DiagnosisWarning",
    "Finding",
    "Findings",
    "LiveDoctor",
    "Thresholds",
    "list_checks",
    "register_check",
    "unregister_check",
]
