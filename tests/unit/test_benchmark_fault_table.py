"""benchmarks/fault_table.py: every fault it names is a drill the scripts have, the drill lines it parses
are the ones the scripts print, and its cells say how many runs did not heal.

The measurement itself needs both two-node labs up (benchmarks/fault_table.py --help)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRILLS = ROOT / "molecule" / "cluster"


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("fault_table", ROOT / "benchmarks" / "fault_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # its `from _lab import ...`, as when run as a script
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_each_fault_is_a_subcommand_of_its_script(table):
    for fault, (argv, runtimes) in table.FAULTS.items():
        script, command = argv[:2]
        text = (DRILLS / script).read_text(encoding="utf-8")
        assert re.search(r"^  %s\)$" % re.escape(command), text, re.M), fault
        assert runtimes and set(runtimes) <= {"container", "native"}, fault


def test_the_drill_line_the_scripts_print_is_the_one_parsed(table):
    # the scripts' own echo lines, with their variables filled as the shell would
    printed = []
    for script in ("engine.sh", "watchdog.sh"):
        for raw in (DRILLS / script).read_text(encoding="utf-8").splitlines():
            line = re.sub(r'\$\((?:[^()"]|"[^"]*")*\)', "12.5", raw)  # $(since "$t0"), $(echo ... | bc)
            m = re.search(r'echo "(UMA-DRILL [^"]*)"', line)
            if m:
                printed.append(re.sub(r"\$\{?\w+\}?", "12.5", m.group(1)))
    assert len(printed) >= 4
    for line in printed:
        m = table.LINE.match(line)
        assert m, line
        assert float(m.group(3)) in (0, 12.5) and float(m.group(4)) == 12.5


def test_cells_show_median_range_and_failures(table):
    runs = [{"detected_s": 3.0, "recovered_s": 40.0}, {"detected_s": 1.0, "recovered_s": 90.0},
            {"error": "exit 1"}]  # fmt: skip
    assert table.cell(runs, "detected_s") == "2.0 s (1.0-3.0), 1 of 3 not healed"
    assert table.cell(runs[:1], "recovered_s") == "40.0 s"
    assert table.cell([{"error": "x"}], "recovered_s") == "not healed (1 of 1)"
    assert table.cell([], "recovered_s") == "-"
