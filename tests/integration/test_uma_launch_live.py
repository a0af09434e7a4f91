"""The launcher run for real (processes, flock, guard, signals) around a stand-in engine.

The stand-in (fixtures/stand_in_engine.py) replaces vLLM only to keep these
tests to seconds; the launch_wrapper Molecule scenario runs the real engine.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

import _node_lib  # the installed node programs
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch

HERE = os.path.dirname(__file__)
LAUNCHER = _node_lib.program("uma_launch.py")  # as the unit runs it: the entry script of the installed package
STAND_IN = os.path.join(HERE, "fixtures", "stand_in_engine.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for i in range(3):
        (model / ("model-%05d-of-00003.safetensors" % (i + 1))).write_bytes(os.urandom(2 << 20))
    return {"tmp": tmp_path, "model": str(model), "state": str(tmp_path / "state"), "lock": str(tmp_path / "lock")}


def launch(env, engine="t1", engine_args=(), extra=(), port=None):
    port = port or free_port()
    argv = [
        sys.executable, LAUNCHER, "--engine", engine, "--node-config", "/nonexistent",
        "--health-url", "http://127.0.0.1:%d/health" % port, "--model-path", env["model"],
        "--lock-path", env["lock"], "--state-dir", env["state"], "--health-timeout", "60", *extra,
        "--", sys.executable, STAND_IN, "--port", str(port), "--model", env["model"], *engine_args,
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(proc, pattern, timeout=60.0):
    """Lines of the launcher's output up to the first match of ``pattern``."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        line = _line_by(proc, deadline)
        if not line:
            break
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match, seen
    raise AssertionError("no %r within %ss in output:\n%s" % (pattern, timeout, "".join(seen)))


def _line_by(proc, deadline):
    """The launcher's next output line; what came of it when the deadline passes or the output ends.
    Byte by byte from the pipe's descriptor: nothing after the line is taken from a later
    ``communicate()``, and a launcher that says nothing more cannot hold the test past its timeout."""
    fd, out = proc.stdout.fileno(), b""
    while not out.endswith(b"\n"):
        ready, _w, _x = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        byte = os.read(fd, 1)
        if not byte:
            break
        out += byte
    return out.decode("utf-8", "replace")


def record(env, engine="t1"):
    with open(os.path.join(env["state"], "launches", engine, "latest", "launch.json")) as handle:
        return json.load(handle)


def lock_is_free(env):
    lock = uma_launch.LaunchLock(env["lock"], "probe")
    try:
        return lock.try_acquire()
    finally:
        lock.release()


def test_healthy_launch_cleans_up_then_waits_for_the_engine(env):
    proc = launch(env)
    _unused, lines = read_until(proc, r"lock-released")
    text = "".join(lines)
    order = [
        m.group(1)
        for m in re.finditer(
            r"\] (launch|lock-acquired|pre-evict|guard-started|engine-started|"
            r"engine-healthy|guard-stopped|post-evict|lock-released)\b",
            text,
        )
    ]
    assert order == ["launch", "lock-acquired", "pre-evict", "guard-started", "engine-started",
                     "engine-healthy", "guard-stopped", "post-evict", "lock-released"]  # fmt: skip
    assert "kv-cache-allocated" in text and "GPU KV cache size: 4096 tokens" in text
    assert lock_is_free(env)
    time.sleep(0.3)
    rec = record(env)
    assert rec["healthy_at"] is not None and rec["kv_alloc_t"] is not None
    assert rec["guard_status"]["state"] == "stopped" and rec["guard_status"]["stop_reason"] == "signal"
    assert os.path.exists(os.path.join(env["state"], "launches", "t1", "latest", "samples.jsonl"))
    # the default: the guard locked its own pages (root here: CAP_IPC_LOCK), and the launcher said so
    assert rec["guard_status"]["locked_kib"] > 1024 and rec["guard_status"]["lock_error"] is None, rec["guard_status"]
    assert re.search(r"guard-stopped .*guard_locked_kib=\d{4,}", text), text
    assert proc.poll() is None, "the launcher stays with its engine"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert record(env)["exit_code"] == 128 + signal.SIGTERM


def test_guard_lock_memory_off_in_the_node_config(env):
    node_config = env["tmp"] / "launch.json"
    node_config.write_text(json.dumps({"guard_lock_memory": False}))
    argv_extra = ("--node-config", str(node_config))
    proc = launch(env, extra=argv_extra)
    _unused, lines = read_until(proc, r"lock-released")
    assert "--lock-memory" not in "".join(lines) and "guard_locked_kib=None" in "".join(lines)
    time.sleep(0.3)  # the record is written after the lock is released
    rec = record(env)
    assert rec["guard_status"]["state"] == "stopped"
    assert rec["guard_status"].get("locked_kib") is None and "lock_error" not in rec["guard_status"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM


def test_engine_killed_during_load(env):
    proc = launch(env, engine_args=("--load-s", "20"))
    match, _unused = read_until(proc, r"engine-started .*pid=(\d+)")
    os.kill(int(match.group(1)), signal.SIGKILL)
    out, _unused = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL
    assert "launch-failed" in out and "guard-stopped" in out and "lock-released" in out
    assert lock_is_free(env)
    rec = record(env)
    assert rec["failed_at"] is not None and rec["healthy_at"] is None
    assert rec["guard_status"]["state"] == "stopped"
    assert rec["exit_code"] == 137


def test_engine_failure_exit_code_propagates(env):
    proc = launch(env, engine_args=("--exit-before-healthy", "3"))
    out, _unused = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    assert "engine exited with 3 before it was healthy" in out
    assert lock_is_free(env)


def test_signal_during_load_stops_engine_and_cleans_up(env):
    proc = launch(env, engine_args=("--load-s", "20"))
    read_until(proc, r"engine-started")
    proc.send_signal(signal.SIGINT)
    out, _unused = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT
    assert "guard-stopped" in out and "lock-released" in out
    assert lock_is_free(env)


def test_second_engine_waits_and_says_for_whom(env):
    holder = uma_launch.LaunchLock(env["lock"], "big-model")
    assert holder.try_acquire()
    proc = launch(env, engine="t2")
    try:
        read_until(proc, r"waiting for the launch lock .* held by engine big-model \(pid %d" % os.getpid(), 30)
        time.sleep(1)
        assert proc.poll() is None
        holder.release()
        read_until(proc, r"lock-acquired", 30)
        read_until(proc, r"lock-released", 60)
    finally:
        holder.release()
        proc.terminate()
        proc.wait(30)


def test_lock_timeout_exits_tempfail(env):
    holder = uma_launch.LaunchLock(env["lock"], "big-model")
    assert holder.try_acquire()
    try:
        proc = launch(env, extra=("--lock-timeout", "1"))
        out, _unused = proc.communicate(timeout=30)
        assert proc.returncode == uma_launch.EXIT_LOCK_TIMEOUT, out
        assert "lock-timeout" in out
    finally:
        holder.release()


def test_dead_holder_never_leaks_the_lock(env):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; sys.path[:0] = %r; "
         "from ansible_collections.uma.vllm.plugins.module_utils.node.launch.program import LaunchLock; "
         "l = LaunchLock(%r, 'doomed'); assert l.try_acquire(); print('held', flush=True); time.sleep(60)"
         % (sys.path, env["lock"])],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    assert not lock_is_free(env)
    holder.kill()
    holder.wait()
    assert lock_is_free(env)


@pytest.mark.parametrize(
    "args, option",
    [
        (["--engine", "bad name", "--health-url", "http://x/health", "--", "true"], "engine"),
        (["--engine", "e", "--health-url", "ftp://x", "--", "true"], "health_url"),
        (["--engine", "e", "--health-url", "http://x/health"], "command"),
        (["--engine", "e", "--health-url", "http://x/h", "--model-path", "/no/such", "--", "true"], "model_path"),
        (["--engine", "e", "--health-url", "http://x/h", "--readahead-kb", "-1", "--", "true"], "readahead_kb"),
        # files without model_path is refused (it was silently turned into a global adaptive guard)
        (["--engine", "e", "--health-url", "http://x/h", "--guard-mode", "files", "--", "true"], "guard_mode"),
    ],
)
def test_bad_configuration_exits_with_the_fix(args, option):
    proc = subprocess.run(
        [sys.executable, LAUNCHER, "--node-config", "/nonexistent", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == uma_launch.EXIT_CONFIG
    assert proc.stderr.startswith("vllm-uma-launch: option '%s' = " % option), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "node, option, problem",
    [
        ({"guard_interval": 0.001}, "guard_interval", "is below 0.01 s"),
        ({"guard_max_duration": 100000}, "guard_max_duration", "must be > 0 and <= 86400"),
        ({"guard_threshold_mib": 0}, "guard_threshold_mib", "is below the minimum 1"),
    ],
)
def test_guard_options_use_the_guards_own_limits(tmp_path, node, option, problem):
    """The launcher's guard_* options go through the guard's validator (GuardConfig), not a copy."""
    node_config = tmp_path / "launch.json"
    node_config.write_text(json.dumps(node))
    args = ["--engine", "e", "--health-url", "http://x/h", "--node-config", str(node_config), "--", "true"]
    proc = subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == uma_launch.EXIT_CONFIG
    assert proc.stderr.startswith("vllm-uma-launch: option '%s' = " % option), proc.stderr
    assert problem in proc.stderr


def test_health_timeout_exits_124(env):
    """No 200 within health_timeout_s: exit 124 (like timeout(1)), decided by the timeout, not by a message."""
    proc = launch(env, engine_args=("--load-s", "30"), extra=("--health-timeout", "2"))
    out, _unused = proc.communicate(timeout=60)
    assert proc.returncode == uma_launch.EXIT_HEALTH_TIMEOUT, out
    assert "within 2.0s" in out
    assert record(env)["exit_code"] == uma_launch.EXIT_HEALTH_TIMEOUT
    assert lock_is_free(env)
