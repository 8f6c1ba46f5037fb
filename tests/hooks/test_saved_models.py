"""A model saved with `torch.save(model)` while hookscope watches it loads with the default, weights-only
`torch.load(f)` given only the user's own classes, in a process that never imports hookscope, with no hook of
hookscope's (issue 26: pytorch/examples' word_language_model failed to load a model saved under `hookscope run`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope.callbacks import ActivationStats
from hookscope.monitors import OutputGradMonitor, OutputMonitor, StateMonitor
from hookscope.reducers import HistoryReducer, StatsReducer
from hookscope.weights import MaxNorm, register_constraint

USER_MODULE = """
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(3, 8), nn.Tanh())
        self.decoder = nn.Linear(8, 2)

    def forward(self, x):
        return self.decoder(self.encoder(x))
"""

LOADER = """
import json, sys
import torch, torch.nn as nn
sys.path.insert(0, sys.argv[1])
import usermodel

with torch.serialization.safe_globals([usermodel.Net, nn.Sequential, nn.Linear, nn.Tanh]):
    model = torch.load(sys.argv[2])  # the default: weights_only=True
tables = [d for m in model.modules() for name, d in vars(m).items() if name.endswith("hooks") and isinstance(d, dict)]
out = model(torch.ones(2, 3))
dunders = sorted(k for m in model.modules() for k in vars(m) if k.startswith("__"))
found = [n for n in sys.modules if n.startswith("hookscope")]
print(json.dumps({"hookscope": found, "hooks": sum(map(len, tables)), "out": out.tolist(), "dict": dunders}))
"""


def _user_class(folder: Path, monkeypatch: pytest.MonkeyPatch) -> type[nn.Module]:
    (folder / "usermodel.py").write_text(USER_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))  # pickle finds the class by its module, as in the user's script
    monkeypatch.delitem(sys.modules, "usermodel", raising=False)
    import usermodel

    net: type[nn.Module] = usermodel.Net
    return net


def test_a_model_saved_under_every_attachment_loads_weights_only_without_hookscope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _user_class(tmp_path, monkeypatch)()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watched = hookscope.watch(model, opt)
    watched.attach()
    stats = ActivationStats(with_hist=True)
    driver = stats.attach(model, opt)
    monitors = [
        OutputMonitor(StatsReducer(), module=model.encoder),
        OutputGradMonitor(HistoryReducer(), module=model.decoder),
        StateMonitor(HistoryReducer(), "weight", module=model.decoder),
    ]
    constraint = register_constraint(model, MaxNorm(5.0), "decoder", mode="forward")
    hooks = hookscope.hook_outputs([model.encoder, model.decoder], grad=True)
    try:
        model(torch.randn(4, 3)).pow(2).mean().backward()
        opt.step()
        assert len(hookscope.list_hooks(model)) > 5
        with torch.no_grad():
            expected = model(torch.ones(2, 3)).tolist()
        torch.save(model, tmp_path / "model.pt")
    finally:
        hooks.remove()
        constraint.remove()
        for monitor in monitors:
            monitor.deregister()
        driver.detach()
        watched.detach()
    assert b"hookscope" not in (tmp_path / "model.pt").read_bytes()
    script = textwrap.dedent(LOADER)
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), str(tmp_path / "model.pt")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout)
    assert loaded == {"hookscope": [], "hooks": 0, "out": loaded["out"], "dict": []}
    assert torch.allclose(torch.tensor(loaded["out"]), torch.tensor(expected))
