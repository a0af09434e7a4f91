"""benchmarks/planner_accuracy.py runs and prints what the planner test asserts."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_planner_accuracy_benchmark_prints_every_row():
    data = ROOT / "tests" / "unit" / "fixtures" / "models" / "kv_observations.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "planner_accuracy.py"), "--json", "--data", str(data)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["id"] for r in rows] == [r["id"] for r in json.loads(data.read_text())]
    for row in rows:
        if row["logged_tokens"]:
            assert abs(row["error_pct"]) < 1.0, row
        else:  # vLLM refused to start: the planner refuses with the same figure
            assert row["planned_tokens"] is None and row["refused_needed_gib"] == "%.2f" % row["logged_needed_gib"]
