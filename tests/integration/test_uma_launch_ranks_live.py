"""Two launchers as the two ranks of one multi-node engine, for real (processes, sockets,
signals), around stand-in engines (fixtures/stand_in_engine.py: NOT vLLM, it only loads
files, answers /health and names child processes like vLLM's). The cluster Molecule
scenario runs the same with the real two-node vLLM engine.

Rank 1's health URL is rank 0's, as the role writes it (a headless rank has no API)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from test_uma_launch_live import LAUNCHER, STAND_IN, free_port, read_until

from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import ranks as _ranks
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch

# the launcher found its rank's VLLM:: processes (it looks again while it found none: the other
# rank's engine can be healthy before this rank's processes took their names)
WATCHING = r"ranks-watched .*count=[1-9]"


@pytest.fixture
def ports():
    return {"api": free_port(), "link": free_port()}


def link_key(tmp_path):
    path = tmp_path / "tp2.link.key"
    if not path.exists():
        path.write_text(os.urandom(32).hex() + "\n")
        os.chmod(str(path), 0o600)
    return str(path)


def write_config(tmp_path, rank, ports, extra_args=(), peer_timeout=30.0, **overrides):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "model-00001-of-00001.safetensors").write_bytes(os.urandom(1 << 20))
    config = {
        "engine": "tp2",
        "command": [
            sys.executable, STAND_IN, "--port", str(ports["api"]), "--model", str(model), "--node-rank", str(rank),
            *extra_args, *(["--headless"] if rank else []), "--workers", "VLLM::Worker_TP",
        ],
        "env": {"VLLM_HOST_IP": "127.0.0.%d" % (rank + 1)},
        "health_url": "http://127.0.0.1:%d/health" % ports["api"],
        "model_path": str(model),
        "lock_path": str(tmp_path / ("lock%d" % rank)),
        "state_dir": str(tmp_path / ("state%d" % rank)),
        "health_timeout_s": 60,
        "stop_timeout_s": 5,
        # the link signed with the engine's key, as the role delivers it (0600, the launcher's user)
        "cluster": {"rank": rank, "nnodes": 2, "head_addr": "127.0.0.1", "link_port": ports["link"],
                    "peer_timeout_s": peer_timeout, "key_file": link_key(tmp_path),
                    "bind_addr": "127.0.0.1" if rank == 0 else None},
    }  # fmt: skip
    config.update(overrides)
    path = tmp_path / ("rank%d.json" % rank)
    path.write_text(json.dumps(config))
    return str(path)


STARTED = []


@pytest.fixture(autouse=True)
def _no_launcher_outlives_its_test():
    """A test that fails leaves no launcher (nor, by their parent-death signals, its engine and
    workers) running into the next tests."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def start(path):
    argv = [sys.executable, LAUNCHER, "--node-config", "/nonexistent", "--config", path]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    STARTED.append(proc)
    return proc


def record(tmp_path, rank):
    with open(tmp_path / ("state%d" % rank) / "launches" / "tp2" / "latest" / "launch.json") as handle:
        return json.load(handle)


def both_healthy(tmp_path, ports, first=1):
    procs = {}
    for rank in [1, 0] if first == 1 else [0, 1]:
        procs[rank] = start(write_config(tmp_path, rank, ports))
        time.sleep(0.5)
    for rank in (0, 1):
        read_until(procs[rank], WATCHING, timeout=60)
    return procs


@pytest.mark.parametrize("first", [0, 1])
def test_a_stop_of_either_rank_stops_the_whole_engine_deliberately(tmp_path, ports, first):
    procs = both_healthy(tmp_path, ports, first=first)
    stopped = 1 - first  # stop the rank that started second, then the other must follow
    started = time.monotonic()
    procs[stopped].send_signal(signal.SIGTERM)
    other = 1 - stopped
    assert procs[other].wait(20) == 0  # a deliberate stop: exit 0, systemd does not restart it
    took = time.monotonic() - started
    procs[stopped].wait(20)
    assert took < 10, took
    rec = record(tmp_path, other)
    assert rec["exit_code"] == 0 and "signal 15" in rec["stopped_because"]
    steps = [s["name"] for s in rec["steps"]]
    assert "ranks-met" in steps and "peer-stopped" in steps and "engine-stopped" in steps


def test_a_stop_that_breaks_the_peers_running_request_is_still_deliberate(tmp_path, ports):
    """systemd stops rank 1 by signalling its whole control group (launcher and engine at
    once); on rank 0 a request in flight (the watchdog's probe) fails on the broken
    collective and takes rank 0's worker down before rank 1's word arrives. Seen in the
    cluster scenario: rank 0 then exited 69 and systemd restarted it to wait for a rank
    that an operator had stopped. Rank 0 must stop with rank 1, deliberately (exit 0)."""
    procs = {}
    for rank in (1, 0):  # each engine takes 3 s to stop, like vLLM's shutdown
        procs[rank] = start(write_config(tmp_path, rank, ports, extra_args=["--stop-s", "3"]))
        time.sleep(0.5)
    for rank in (0, 1):
        read_until(procs[rank], WATCHING, timeout=60)
    worker0 = next(iter(_ranks.vllm_processes(engine_pid(procs[0]))))
    engine1 = engine_pid(procs[1])
    os.kill(worker0, signal.SIGKILL)  # the broken collective, a moment before the word
    time.sleep(0.1)
    for pid in (procs[1].pid, engine1):  # KillMode=control-group: everyone at once
        os.kill(pid, signal.SIGTERM)
    assert procs[0].wait(20) == 0, record(tmp_path, 0)
    assert procs[1].wait(20) == 0  # its engine ended its shutdown with 0
    rec = record(tmp_path, 0)
    assert rec["stopped_because"] == "rank 1 stopped: rank 1: signal 15", rec
    steps = [s["name"] for s in rec["steps"]]
    assert "peer-stopped" in steps and "rank-process-died" not in steps, steps


def _slow_pair(tmp_path, ports, stop_s):
    """Both ranks healthy; each engine takes ``stop_s`` to end after SIGTERM, as vLLM's headless
    rank does when its workers are blocked on a peer that is gone (5 s grace + 4 s, then SIGKILL)."""
    procs = {}
    for rank in (1, 0):
        config = write_config(tmp_path, rank, ports, extra_args=["--stop-s", str(stop_s)], stop_timeout_s=60)
        procs[rank] = start(config)
        time.sleep(0.5)
    for rank in (0, 1):
        read_until(procs[rank], WATCHING, timeout=60)
    return procs


def test_a_rank_whose_peer_stopped_kills_its_engine_after_the_grace_not_the_stop_timeout(tmp_path, ports):
    """Rank 0 stops deliberately: rank 1 has nothing to drain, so its engine gets
    peer_stop_grace_s (2 s) after SIGTERM, then its VLLM:: processes and the engine are killed,
    instead of waiting out a shutdown that only waits for the broken group (here 40 s)."""
    procs = _slow_pair(tmp_path, ports, stop_s=40)
    worker1 = list(_ranks.vllm_processes(engine_pid(procs[1])))
    assert worker1
    started = time.monotonic()
    procs[0].send_signal(signal.SIGTERM)
    assert procs[1].wait(30) == 0  # deliberate: exit 0
    took = time.monotonic() - started
    assert took < 8, took  # grace 2 s + the link's word; 40 s before
    assert len(_ranks.gone({pid: "VLLM::Worker_TP" for pid in worker1})) == len(worker1)  # killed, not left
    rec = record(tmp_path, 1)
    stopped = [s for s in rec["steps"] if s["name"] == "engine-stopped"][-1]
    assert stopped["killed_after_peer"] >= 2 and stopped["duration_s"] < 6, stopped
    procs[0].kill()
    procs[0].wait(10)


def test_a_rank_stopped_itself_keeps_its_engines_graceful_shutdown(tmp_path, ports):
    """The short grace is only for a rank whose peer is gone: the rank that is stopped keeps its
    engine's whole shutdown (here 3 s, within stop_timeout_s)."""
    procs = _slow_pair(tmp_path, ports, stop_s=3)
    started = time.monotonic()
    procs[0].send_signal(signal.SIGTERM)
    procs[0].wait(30)
    took = time.monotonic() - started
    assert took >= 2.9, took  # its engine's own 3 s shutdown, not cut short
    rec = record(tmp_path, 0)
    assert not [s for s in rec["steps"] if "killed_after_peer" in s], rec["steps"]
    assert procs[1].wait(30) == 0


def test_a_dead_rank_process_fails_both_ranks_for_a_restart(tmp_path, ports):
    procs = both_healthy(tmp_path, ports)
    watched = _ranks.vllm_processes(engine_pid(procs[1]))
    assert sorted(watched.values()) == ["VLLM::Worker_TP"]
    os.kill(next(iter(watched)), signal.SIGKILL)  # rank 1's worker dies, its engine process lives
    assert procs[1].wait(20) == uma_launch.EXIT_PEER
    assert procs[0].wait(20) == uma_launch.EXIT_PEER
    assert "VLLM::Worker_TP (pid" in record(tmp_path, 1)["stopped_because"]
    assert record(tmp_path, 0)["stopped_because"].startswith("rank 1 stopped: rank 1: rank process")


def test_rank_processes_named_after_the_engine_is_healthy_are_still_watched(tmp_path, ports):
    """Rank 0's engine is healthy before rank 1's processes took their VLLM:: names (seen in a
    loaded CI run: rank 1's launcher looked once, found none and never noticed its worker's death).
    It looks again until it finds them; their death then fails both ranks as always."""
    late = ["--workers-late-s", "3"]  # both ranks run the same argv; only the headless rank 1 heeds it
    procs = {1: start(write_config(tmp_path, 1, ports, extra_args=late))}
    time.sleep(0.5)
    procs[0] = start(write_config(tmp_path, 0, ports, extra_args=late))
    read_until(procs[0], WATCHING, timeout=60)
    match, _seen = read_until(procs[1], r"ranks-watched .*count=(\d+)", timeout=60)
    assert match.group(1) == "0"  # its first look: nothing yet
    read_until(procs[1], r"ranks-watched .*count=1 late=True", timeout=30)
    watched = _ranks.vllm_processes(engine_pid(procs[1]))
    os.kill(next(iter(watched)), signal.SIGKILL)
    assert procs[1].wait(20) == uma_launch.EXIT_PEER
    assert procs[0].wait(20) == uma_launch.EXIT_PEER
    assert "VLLM::Worker_TP (pid" in record(tmp_path, 1)["stopped_because"]


def test_an_engine_that_exits_fails_the_peer_too(tmp_path, ports):
    procs = both_healthy(tmp_path, ports)
    os.kill(engine_pid(procs[0]), signal.SIGKILL)  # rank 0's engine process dies
    assert procs[0].wait(20) == 128 + signal.SIGKILL
    assert procs[1].wait(20) == uma_launch.EXIT_PEER
    assert "its engine exited with -9" in record(tmp_path, 1)["stopped_because"]


def test_ranks_with_different_configurations_never_start(tmp_path, ports):
    procs = {1: start(write_config(tmp_path, 1, ports, extra_args=["--load-s", "0.7"]))}
    procs[0] = start(write_config(tmp_path, 0, ports))
    for rank in (0, 1):
        assert procs[rank].wait(30) == uma_launch.EXIT_CONFIG
        rec = record(tmp_path, rank)
        assert "runs another configuration" in rec["stopped_because"] and "'--load-s'" in rec["stopped_because"]
        assert "engine-started" not in [s["name"] for s in rec["steps"]]


def test_a_rank_alone_waits_then_gives_up_without_loading(tmp_path, ports):
    proc = start(write_config(tmp_path, 1, ports, peer_timeout=2))
    assert proc.wait(30) == uma_launch.EXIT_PEER
    rec = record(tmp_path, 1)
    assert "did not answer within 2s" in rec["stopped_because"]
    assert "engine-started" not in [s["name"] for s in rec["steps"]]


def test_a_strangers_hello_and_stop_change_nothing_and_the_stranger_is_named(tmp_path, ports):
    """Issue 19 item 7, with the real launchers: during the rendezvous a stranger (no key) says
    hello as rank 1 with another configuration, then stop. Rank 0 names it and keeps waiting
    (before: exit 78); the real rank 1 joins; once met, the link port takes no connection."""
    procs = {0: start(write_config(tmp_path, 0, ports))}
    read_until(procs[0], r"waiting on port", timeout=30)
    hello = {"hello": "tp2", "rank": 1, "fingerprint": "0" * 16, "shared": {"engine": "tp2", "argv": ["other"]}}
    for message in (hello, {"stop": "forged", "deliberate": True, "rank": 1}):
        with socket.create_connection(("127.0.0.1", ports["link"]), timeout=5) as sock:
            sock.sendall((json.dumps(message) + "\n").encode())
            sock.settimeout(5)
            while sock.recv(4096):
                pass
    named = r"refused a hello as rank 1 of engine 'tp2' not signed with this engine's key from 127\.0\.0\.1:"
    read_until(procs[0], named, timeout=10)
    assert procs[0].poll() is None
    procs[1] = start(write_config(tmp_path, 1, ports))
    for rank in (0, 1):
        read_until(procs[rank], WATCHING, timeout=60)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", ports["link"]), timeout=5).close()
    procs[0].send_signal(signal.SIGTERM)
    assert procs[1].wait(20) == 0 and procs[0].wait(20) == 128 + signal.SIGTERM
    steps = [s["name"] for s in record(tmp_path, 0)["steps"]]
    assert "ranks-met" in steps and "ranks-refused" not in steps


def engine_pid(launcher):
    """The launcher's engine child (the stand-in)."""
    out = subprocess.run(
        ["pgrep", "-P", str(launcher.pid), "-f", "stand_in_engine"], capture_output=True, text=True, check=False
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, out
    return pids[0]
