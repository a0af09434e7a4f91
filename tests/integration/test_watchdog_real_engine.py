"""The watchdog against the real vLLM CPU engine (lab image, lab venv, tiny Llama) on this machine's docker.

Proven here with a real engine, not a stand-in: vLLM's /metrics carries the names the
watchdog reads (running/waiting gauges, token counters); the 1-token completion works with
the API key from the environment (and is refused without it); a real generation load is
"busy, counters moving", never a wedge; a SIGSTOP of the real ``VLLM::EngineCore`` process
(found through ``docker inspect`` as the container runtime does) is a wedge within the
bound, while the engine's own /health is observed as it really behaves.

The unit is not systemd here: ``systemctl`` is a stand-in runner that says "active" and
records stop/start (the Molecule scenario proves the real restarts). Needs the lab lock:
``flock /tmp/uma-lab.lock python -m pytest tests/integration/test_watchdog_real_engine.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from test_vllm_parser_oracle import IMAGE, ROOT, VENV, _require

from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import Systemd
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic, probes
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as wd

# tests/all.sh runs this file with no other test beside it: it decides a wedge by the wall
# clock on a CPU-bound real engine
pytestmark = pytest.mark.alone

API_KEY = "wd-itest-%d" % os.getpid()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    _require()
    work = tmp_path_factory.mktemp("watchdog-real")
    model = str(work / "tiny")
    subprocess.run([sys.executable, str(ROOT / "lab" / "make_model.py"), "--out", model], check=True, timeout=300)
    port = _free_port()
    name = "itest-wd-%d" % os.getpid()
    argv = [
        "docker", "run", "-d", "--rm", "--name", name, "--network", "host", "--shm-size", "1g",
        "-v", "%s:/opt/vllm:ro" % VENV, "-v", "%s:%s:ro" % (model, model),
        "-e", "VLLM_CPU_KVCACHE_SPACE=1", "-e", "VLLM_API_KEY",
        IMAGE, "/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "512", "--max-num-seqs", "4", "--enforce-eager",
    ]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, env=dict(os.environ, VLLM_API_KEY=API_KEY))
    url = "http://127.0.0.1:%d" % port
    started = time.monotonic()
    healthy = False
    while time.monotonic() - started < 900:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                healthy = response.status == 200
        except OSError:
            healthy = False
        if healthy:
            break
        if subprocess.run(["docker", "inspect", name], check=False, capture_output=True).returncode != 0:
            break
        time.sleep(2)
    logs = subprocess.run(["docker", "logs", name], check=False, capture_output=True, text=True)
    if not healthy:
        subprocess.run(["docker", "rm", "-f", name], check=False, capture_output=True)
        pytest.fail("the engine did not become healthy: %s" % (logs.stdout + logs.stderr)[-3000:])
    print("\nreal engine healthy after %.1f s" % (time.monotonic() - started))
    yield {"url": url, "name": name, "work": work, "model": model}
    subprocess.run(["docker", "rm", "-f", name], check=False, capture_output=True)


class Units:
    """systemctl stand-in: the unit is active; stop/start are recorded, not done. docker is real."""

    def __init__(self):
        self.calls = []

    def __call__(self, argv):
        if argv[0] == "systemctl":
            self.calls.append(argv[1])
            if argv[1] == "show":
                return 0, "ActiveState=active\nSubState=running\nMainPID=0\nControlGroup=\nNRestarts=0\n", ""
            return 0, "", ""
        return wd._run(argv)


def make_dog(engine, tmp_path, monkeypatch, **over):
    monkeypatch.setenv("VLLM_API_KEY", API_KEY)
    raw = {
        "engine": "main", "base_url": engine["url"], "container": engine["name"], "interval_s": 1.0,
        "probe_timeout_s": 10.0, "health_timeout_s": 5.0, "fail_threshold": 2, "busy_stall_s": 120.0,
        "processes": [{"match": "VLLM::EngineCore", "min": 1}], "state_dir": str(tmp_path / "state"),
        "model_path": engine["model"],
    }  # fmt: skip
    raw.update(over)
    units = Units()
    return wd.Watchdog(logic.validate(raw), systemd=Systemd(units, "systemctl", None)), units


def engine_core_pid(engine):
    cfg = logic.validate({"engine": "main", "container": engine["name"]})
    for pid in probes.container_pids(cfg, wd._run):
        if "VLLM::EngineCore" in (probes.proc_info(pid) or {}).get("cmdline", ""):
            return pid
    raise AssertionError("no VLLM::EngineCore process in the container")


def test_real_metrics_and_completion(engine, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", API_KEY)
    cfg = logic.validate({"engine": "main", "base_url": engine["url"], "probe_timeout_s": 30.0})
    metrics = probes.read_metrics(cfg)
    assert metrics is not None and metrics["running"] == 0 and metrics["waiting"] == 0
    assert {"vllm:generation_tokens_total", "vllm:prompt_tokens_total"} <= set(metrics["progress"])
    assert probes.model_id(cfg) == "tiny"
    result = probes.probe_completion(cfg, "tiny")
    print("\nreal 1-token completion: %.3f s" % result["latency_s"])
    assert result["ok"], result
    after = probes.read_metrics(cfg)
    assert logic.progressed(metrics["progress"], after["progress"])  # the probe itself moves the counters
    monkeypatch.delenv("VLLM_API_KEY")
    refused = probes.probe_completion(cfg, "tiny")
    assert refused["error"] == "HTTP 401"


LOADED_TICKS = 4  # watchdog ticks with requests running that the busy test waits for (2 x fail_threshold)


def test_real_generation_load_is_busy_not_wedged(engine, tmp_path, monkeypatch):
    """A steady generation load, kept up for as many ticks as the test needs (not for a fixed time).

    The load runs until the watchdog has ticked ``LOADED_TICKS`` times while the engine's own gauges
    said requests were running, so a slow machine (CI: 2 cores shared with the engine) cannot end
    the load before the watchdog has looked at it; a load request that fails fails the test with
    its error instead of silently ending the load.
    """
    dog, units = make_dog(engine, tmp_path, monkeypatch)
    cfg = logic.validate({"engine": "main", "base_url": engine["url"], "probe_timeout_s": 30.0})
    body = json.dumps({"model": "tiny", "prompt": "a b c", "max_tokens": 400, "ignore_eos": True}).encode()
    stop = threading.Event()
    errors = []

    def load():
        request = urllib.request.Request(
            engine["url"] + "/v1/completions", data=body, headers={
                "Content-Type": "application/json", "Authorization": "Bearer " + API_KEY}
        )  # fmt: skip
        while not stop.is_set():
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()
            except Exception as err:  # the test fails with it below
                errors.append("%s: %s" % (type(err).__name__, err))
                return

    threads = [threading.Thread(target=load, daemon=True) for _unused in range(3)]
    for t in threads:
        t.start()
    verdicts, loaded, durations = [], 0, []
    deadline = time.monotonic() + 600
    try:
        # the engine's own gauge first: the load is really running before the watchdog looks
        while not errors and time.monotonic() < deadline:
            metrics = probes.read_metrics(cfg)
            if metrics is not None and metrics["running"] > 0:
                break
            time.sleep(0.5)
        while not errors and loaded < LOADED_TICKS and time.monotonic() < deadline:
            started = time.monotonic()
            actions = dog.tick()
            durations.append(time.monotonic() - started)
            assert [a for a in actions if a["do"] in ("restart", "stop")] == [], actions
            verdicts.append(dog.state["last_verdict"]["kind"])
            metrics = probes.read_metrics(cfg)
            loaded += int(metrics is not None and metrics["running"] > 0)
            time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=330)
    print("\nreal load: %d ticks (%d with requests running), verdicts %s, tick %.2f-%.2f s" % (
        len(verdicts), loaded, {k: verdicts.count(k) for k in set(verdicts)}, min(durations or [0]),
        max(durations or [0])))  # fmt: skip
    assert errors == [], errors
    assert loaded >= LOADED_TICKS, "the load was not running for %d ticks within 600 s" % LOADED_TICKS
    assert "busy" in verdicts
    assert dog.state["counts"]["wedges"] == 0 and "stop" not in units.calls


def test_sigstop_of_the_real_engine_core_is_a_wedge(engine, tmp_path, monkeypatch):
    dog, units = make_dog(engine, tmp_path, monkeypatch)
    for _unused in range(3):
        dog.tick()
    assert dog.state["phase"] == "healthy", dog.state
    core = engine_core_pid(engine)
    stopped_at = time.time()
    os.kill(core, signal.SIGSTOP)
    try:
        decided = None
        for _unused in range(30):
            actions = dog.tick()
            restarts = [a for a in actions if a["do"] == "restart"]
            if restarts:
                decided = dog.events[-1]["evidence"]["decided_at_epoch_s"] - stopped_at
                reason = restarts[0]["reason"]
                break
            time.sleep(1.0)
        # how the real engine looks from outside while its core is stopped
        health_while_stopped = probes.probe_health(dog.cfg)
        probe_while_stopped = probes.probe_completion(dog.cfg, "tiny")
    finally:
        os.kill(core, signal.SIGCONT)
    print(
        "\nreal EngineCore SIGSTOP: /health %s, 1-token completion %s; wedge decided after %s s (%s)"
        % (
            "200" if health_while_stopped["ok"] else health_while_stopped["error"],
            "ok" if probe_while_stopped["ok"] else probe_while_stopped["error"],
            None if decided is None else round(decided, 2),
            reason if decided is not None else "-",
        )
    )
    assert decided is not None and decided < 30
    assert "is stopped (state T)" in reason
    assert units.calls.count("stop") == 1 and units.calls.count("start") == 1
    assert not probe_while_stopped["ok"]
