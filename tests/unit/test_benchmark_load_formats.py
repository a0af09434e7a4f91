"""benchmarks/load_formats.py without an engine: what it reads from vLLM's log and the kernel's
files, the table's medians, and its refusals. The measurement itself needs root and the lab venv
(sudo .venv/bin/python benchmarks/load_formats.py; docs/LOAD-FORMATS.md)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "load_formats.py"


@pytest.fixture(scope="module")
def lf():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("load_formats", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_vllms_load_line_is_read_and_the_slowest_rank_counts(lf):
    text = (
        "(Worker_TP0 pid=39) INFO 11-28 02:09:35 [default_loader.py:501] Loading weights took 1.56 seconds\n"
        "(Worker_TP1 pid=22) INFO 11-28 02:09:35 [default_loader.py:501] Loading weights took 0.63 seconds\n"
    )
    assert lf.load_seconds(text) == 1.56
    assert lf.load_seconds("no such line") is None
    runai = "Loading safetensors using Runai Model Streamer: 100% Completed | 85/85 [01:02<00:00, 36.75it/s]\n"
    assert lf.load_seconds(runai) == 62.0


def test_disk_reads_come_from_the_devices_sectors_read(lf):
    stats = "   8       0 sda 100 0 4096 10 0 0 0 0 0 0 0\n 259       1 nvme0n1p1 7 0 2048 3 0 0 0 0 0 0 0\n"
    assert lf.diskstats_read_bytes(stats, "nvme0n1p1") == 2048 * 512
    assert lf.diskstats_read_bytes(stats, "sda") == 4096 * 512
    assert lf.diskstats_read_bytes(stats, "vdb") is None


def test_the_process_tree_holds_this_process_and_its_child(lf):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert {os.getpid(), child.pid} <= set(lf.children(os.getpid()))
        rss, cpu = lf.proc_numbers(child.pid)
        assert rss > 0 and cpu >= 0
    finally:
        child.kill()
        child.wait()
    assert lf.proc_numbers(child.pid) is None


def test_medians_use_only_healthy_runs_and_count_the_failed(lf):
    runs = [
        {"format": "mmap", "cold": True, "ok": True, "healthy_s": 30.0, "cpu_s": 50.0},
        {"format": "mmap", "cold": True, "ok": True, "healthy_s": 34.0, "cpu_s": 52.0},
        {"format": "mmap", "cold": True, "ok": True, "healthy_s": 31.0, "cpu_s": 51.0},
        {"format": "runai", "cold": True, "ok": False, "healthy_s": None, "cpu_s": 9.0},
    ]
    table = lf.medians(runs)
    assert table[("mmap", True)]["healthy_s"] == (31.0, 30.0, 34.0)
    assert table[("mmap", True)]["runs"] == 3 and table[("mmap", True)]["failed"] == 0
    assert table[("runai", True)] == {"runs": 1, "failed": 1}
    text = lf.render(table, "the machine")
    assert text.splitlines()[0] == "the machine"
    assert "| mmap | cold | 3 (0 failed) | 31.0 (30.0-34.0) |" in text
    assert "| runai | cold | 1 (1 failed) | - |" in text
    assert "Not run here: fastsafetensors" in text


@pytest.mark.parametrize(
    "argv, named",
    [(["--formats", "mmap,zip"], "--formats"), (["--formats", ","], "--formats"), (["--rounds", "0"], "--rounds"),
     (["--sample-ms", "1"], "--sample-ms")],
)  # fmt: skip
def test_bad_options_exit_2_naming_the_option(argv, named):
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and named in proc.stderr and "Traceback" not in proc.stderr
