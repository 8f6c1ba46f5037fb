"""The patching benchmark runs end to end on a tiny GPT-2 (no assertion about time): every method's effects agree
with hookscope's, and the table and the JSON are written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "steer.py"


@pytest.mark.slow
def test_quick_benchmark_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "steer.json"
    command = [sys.executable, str(BENCH), "--quick", "--rounds", "1", "--threads", "1", "--no-lens", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr
    assert "| method (16 cells) | median sweep (s) |" in done.stdout and "| hookscope | " in done.stdout
    rows = json.loads(out.read_text())["results"]
    assert rows["hookscope"]["ratio_to_hookscope"] == 1.0
    names = {"naive loop of forwards (torch hooks)", "nnsight, batched invokes", "nnsight, one trace per cell"}
    assert names <= rows.keys()  # TransformerLens's bridge is left out here: tests/steer/test_peers.py runs it
    assert all(row["max_abs_difference"] <= 1e-4 for row in rows.values())  # bench.steer.TOLERANCE
