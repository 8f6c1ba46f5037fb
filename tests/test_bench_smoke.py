"""The overhead and budget benchmarks run end to end on one model for a few steps (no assertion about time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "overhead.py"
BUDGET = BENCH.with_name("budget.py")


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
    assert {
        "hooks doing nothing",
        "naive per-layer .item() (reference)",
        "the reads of watch(every=1) alone (floor)",
    } <= (rows.keys())
    assert all(r["q1"] <= r["median_ratio"] <= r["q3"] for r in rows.values())


def test_budget_benchmark_prints_the_real_and_charged_ratios_of_both_monitors() -> None:
    command = [sys.executable, str(BUDGET), "--models", "tiny", "--rounds", "1", "--block", "40"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=BUDGET.parent)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| tiny |")]
    assert [row[1].strip() for row in rows] == ["watch", "ActivationStats"]
    for _, _, real, charged in rows:
        assert float(real) > 0 and float(charged) >= 1  # charged: 1 + what the budget counted as its own
