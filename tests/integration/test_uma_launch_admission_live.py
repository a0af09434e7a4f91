"""The launcher's admission check run for real against this machine's /proc/meminfo
(stand-in engine; the launch_wrapper Molecule scenario refuses a real vLLM engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import _node_lib  # the installed node programs
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import read_meminfo
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch

# tests/all.sh runs this file with no other test beside it: it reads
# this machine's MemAvailable
pytestmark = pytest.mark.alone

HERE = os.path.dirname(__file__)
STAND_IN = os.path.join(HERE, "fixtures", "stand_in_engine.py")


def run(tmp_path, request_bytes, wait="1"):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "model-00001-of-00001.safetensors").write_bytes(os.urandom(1 << 20))
    argv = [
        sys.executable, _node_lib.program("uma_launch.py"), "--engine", "adm", "--node-config", "/nonexistent",
        "--health-url", "http://127.0.0.1:9/health", "--model-path", str(model),
        "--lock-path", str(tmp_path / "lock"), "--state-dir", str(tmp_path / "state"),
        "--health-timeout", "30", "--admission-request-bytes", str(request_bytes), "--admission-wait", wait,
        "--", sys.executable, STAND_IN, "--port", "9", "--model", str(model), "--exit-before-healthy", "7",
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - started


def test_a_start_the_node_cannot_hold_is_refused_in_seconds(tmp_path):
    available = read_meminfo("/proc")["MemAvailable"]
    proc, took = run(tmp_path, available + (64 << 30))
    assert proc.returncode == uma_launch.EXIT_ADMISSION, proc.stdout + proc.stderr
    assert took < 15
    assert "admission-refused" in proc.stdout and "engine-started" not in proc.stdout
    with open(tmp_path / "state" / "launches" / "adm" / "latest" / "launch.json") as handle:
        rec = json.load(handle)
    assert rec["exit_code"] == 75 and rec["admission"]["admitted"] is False
    assert rec["admission"]["short_bytes"] > 60 << 30
    assert 1.0 <= rec["admission"]["waited_s"] < 10


def test_a_start_that_fits_goes_on_to_the_engine(tmp_path):
    proc, _took = run(tmp_path, 1 << 20, wait="0")
    # admitted: the (stand-in) engine runs and its own exit code comes back
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert "admission " in proc.stdout and "engine-started" in proc.stdout
