"""The overhead benchmark runs end to end on one model for a few steps (no assertion about time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "overhead.py"


def test_quick_benchmark_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    command = [sys.executable, str(BENCH), "--quick", "--models", "tiny", "--rounds", "2", "--steps", "1"]
    command += ["--memory-steps", "0", "--no-compile", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "| configuration | tiny |" in done.stdout and "| bare |" in done.stdout
    report = json.loads(out.read_text())
    rows = report["results"]["tiny"]
    assert rows["bare"]["median_ratio"] == 1.0
    assert {"hooks doing nothing", "naive per-layer .item() (reference)"} <= rows.keys()
    assert all(r["q1"] <= r["median_ratio"] <= r["q3"] for r in rows.values())
