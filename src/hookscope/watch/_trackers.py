"""What the experiment-tracker sinks share (`_wandb.py`, `_mlflow.py`): the names values are logged under, one row
of values per recorded step, the findings as a table, the report folder to upload, and the missing-extra message.

Names follow `wandb.watch` where it has one and hookscope's groups elsewhere:

| WatchResults                        | logged as                                   |
|-------------------------------------|---------------------------------------------|
| `param_grads[name][stat]`           | `gradients/<name>/<stat>` (norm, nonfinite) |
| `update_ratios[name]`               | `parameters/<name>/update_ratio`            |
| `activations[path][stat]`           | `activations/<path>/<stat>`                 |
| `output_grads[path][stat]`          | `output_gradients/<path>/<stat>`            |
| `residual[path][stat]`              | `residual/<path>/<stat>`                    |
| `optimizer[name][stat]`             | `optimizer/<name>/<stat>`                   |
| `losses`                            | `hookscope/loss`, `hookscope/loss_count`    |
| the recorded step                   | `hookscope/step` (W&B; MLflow's own step)   |

The root module's path `""` is `(root)`. The loss is `hookscope/loss`, not `loss`, so that it never mixes with a
loss the training script logs itself. Values are those of `WatchResults.to_records()` (a step where a layer was not
observed has no value, rather than NaN).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .._text import ROOT, neutralize
from ..results._results import WatchResults

__all__ = [
    "FINDING_COLUMNS",
    "LOSS_KEY",
    "STEP_KEY",
    "KeyNames",
    "finding_rows",
    "import_extra",
    "report_folder",
    "step_rows",
    "tracker_key",
]

STEP_KEY = "hookscope/step"
LOSS_KEY = "hookscope/loss"
PREFIXES = ("gradients", "parameters", "activations", "output_gradients")
"""The first part of every logged name but the loss and the step (`tracker_key`)."""
_GROUPS = {
    "param_grads": "gradients",
    "activations": "activations",
    "output_grads": "output_gradients",
    "residual": "residual",
    "optimizer": "optimizer",
}
FINDING_COLUMNS = ("severity", "check", "layer", "step", "message", "advice", "evidence")
"""The columns of the findings table, in order (`finding_rows`)."""


def tracker_key(group: str, name: str, stat: str) -> str:
    """The name a value of `WatchResults.series()[group][name][stat]` is logged under (see the module's table).

    >>> tracker_key("param_grads", "0.weight", "norm"), tracker_key("activations", "", "mean")
    ('gradients/0.weight/norm', 'activations/(root)/mean')
    >>> tracker_key("update_ratios", "0.weight", "ratio"), tracker_key("losses", "loss", "loss")
    ('parameters/0.weight/update_ratio', 'hookscope/loss')
    """
    if group == "losses":
        return LOSS_KEY if stat == "loss" else f"{LOSS_KEY}_{stat}"  # the loss, and how many were logged
    shown = neutralize(name) or ROOT
    if group == "update_ratios":
        return f"parameters/{shown}/update_ratio"
    return f"{_GROUPS[group]}/{shown}/{stat}"


class KeyNames:
    """Names a tracker accepts, made once per name and kept distinct: characters the tracker refuses are replaced,
    names longer than it allows are cut with a digest of the whole name, and two names that would end the same
    get `~2`, `~3` ... in the order they were first seen.

    Args:
        allowed: a regular expression of one allowed character (`None`: every character).
        max_length: the longest name the tracker takes (`None`: no limit).
    """

    def __init__(self, allowed: str | None = None, max_length: int | None = None) -> None:
        self._refused = None if allowed is None else re.compile(f"(?!{allowed}).")
        self._max_length = max_length
        self._names: dict[str, str] = {}
        self._taken: set[str] = set()

    def __call__(self, key: str) -> str:
        """Return the tracker's name for `key` (the same one every time)."""
        name = self._names.get(key)
        if name is None:
            name = self._fit(key)
            candidate, count = name, 1
            while candidate in self._taken:
                count += 1
                candidate = f"{name}~{count}"
            name = candidate
            self._names[key] = name
            self._taken.add(name)
        return name

    def _fit(self, key: str) -> str:
        name = key if self._refused is None else self._refused.sub("_", key)
        if self._max_length is not None and len(name) > self._max_length:
            digest = hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            name = f"{name[: self._max_length - 13]}~{digest}"  # room for the digest and a `~N` suffix
        return name


def step_rows(results: WatchResults, name: Callable[[str], str] = str) -> list[tuple[int, dict[str, float]]]:
    """The recorded values of `results` as one `{logged name: value}` row per recorded step, oldest first.

    `name` maps `tracker_key` names to the tracker's own (a `KeyNames`).
    """
    rows: dict[int, dict[str, float]] = {}
    for record in results.to_records():
        key = name(tracker_key(record["group"], record["name"], record["stat"]))
        rows.setdefault(record["step"], {})[key] = record["value"]
    return sorted(rows.items())


def finding_rows(findings: Iterable[Any]) -> list[list[Any]]:
    """The findings (`hookscope.doctor.Finding`, or their `to_dict()`) as rows of `FINDING_COLUMNS`.

    Raises:
        TypeError: an item is neither a finding nor a dict.
    """
    rows = []
    for finding in findings:
        values = finding if isinstance(finding, dict) else getattr(finding, "to_dict", lambda: None)()
        if not isinstance(values, dict):
            raise TypeError(
                f"findings must be hookscope.doctor Finding objects (diagnose(results)), got {type(finding).__name__}"
            )
        path = values.get("path")
        layer = "(model)" if path is None else neutralize(path) or ROOT
        evidence = json.dumps(values.get("evidence") or {}, sort_keys=True, default=str)
        row = [values.get("severity"), values.get("check"), layer, values.get("step"), values.get("message")]
        rows.append([*row, values.get("advice") or "", evidence])
    return rows


def report_folder(folder: str | os.PathLike[str]) -> Path:
    """The folder of a report: `folder` itself, or the folder of the page `write_report` returned.

    Raises:
        ValueError: `folder` is neither an existing folder nor a file in one.
    """
    path = Path(folder)
    if path.is_file():
        path = path.parent
    if not path.is_dir():
        raise ValueError(
            f"folder must be the folder a report was written to, got {str(path)!r}, which is not a folder; write "
            "one with hookscope.report.write_report(folder, results)"
        )
    return path


def import_extra(module: str, needed_for: str, extra: str) -> Any:
    """Import `module`, or raise the one-line ImportError that names the extra to install.

    Raises:
        ImportError: `module` is not installed (`pip install 'hookscope[<extra>]'`).
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{needed_for} needs {module.partition('.')[0]}, not installed: pip install 'hookscope[{extra}]'"
        ) from err
