"""Side by side with peers on the same HF GPT-2 (built from a config, random weights, no download): nnsight 0.8
wraps the very module; TransformerLens 4.3's HF bridge wraps a copy. Recordings and a layer x position patching
sweep agree to 1e-5. The peers run in their own process (scripts/peers.py says why)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "peers.py"


@pytest.mark.slow
def test_recording_and_a_layer_by_position_sweep_agree_with_nnsight_and_transformer_lens() -> None:
    if not all(importlib.util.find_spec(name) for name in ("nnsight", "transformer_lens")):  # never imported here
        pytest.skip("nnsight and transformer-lens are dev dependencies (pip install -e '.[dev]')")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for peer in ("nnsight", "transformer_lens"):
        assert report[peer]["recording"] <= 1e-5 and report[peer]["sweep"] <= 1e-5, (peer, report)
        assert report[peer]["effects_span"] > 0.1  # the sweep compared real effects, not zeros
