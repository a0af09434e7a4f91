"""`systemctl restart` of one rank of a multi-node engine (a day-2 finding, 28 Nov 2026).

A `systemctl restart uma-vllm@tp2` on rank 0 stopped the engine for good: rank 0's launcher told
rank 1 "signal 15, deliberate", rank 1 exited 0 (Restart=on-failure does not bring that back),
and rank 0's new launcher waited for a rank 1 that nobody started. The launcher now asks systemd
whether its own unit has a restart job running when it gets SIGTERM; then the word to the peers is
not deliberate (exit 69, systemd restarts them and they meet the restarted rank), as for a node
that shuts down.
"""

from __future__ import annotations

import io
import subprocess
from types import SimpleNamespace

import node_helpers

from ansible_collections.uma.vllm.plugins.module_utils.node.launch import node as launch_node
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch


def _cgroup(tmp_path, text):
    path = tmp_path / "cgroup"
    path.write_text(text)
    return str(path)


def test_own_unit_from_a_cgroup_v2_path(tmp_path):
    path = _cgroup(tmp_path, "0::/system.slice/system-uma\\x2dvllm.slice/uma-vllm@tp2.service\n")
    assert launch_node.own_unit(path) == "uma-vllm@tp2.service"


def test_own_unit_from_a_hybrid_hierarchy(tmp_path):
    text = "12:pids:/system.slice/uma-vllm@main.service\n1:name=systemd:/system.slice/uma-vllm@main.service\n0::/\n"
    assert launch_node.own_unit(_cgroup(tmp_path, text)) == "uma-vllm@main.service"


def test_own_unit_outside_a_service_or_unreadable(tmp_path):
    assert launch_node.own_unit(_cgroup(tmp_path, "0::/user.slice/user-0.slice/session-3.scope\n")) is None
    assert launch_node.own_unit(_cgroup(tmp_path, "0::/\n")) is None
    assert launch_node.own_unit(str(tmp_path / "missing")) is None


def _jobs(stdout, returncode=0):
    calls = []

    def runner(argv, **_kw):
        calls.append(argv)
        return SimpleNamespace(stdout=stdout, returncode=returncode)

    return runner, calls


def test_a_restart_job_of_this_unit_is_a_restart():
    runner, calls = _jobs("655 uma-vllm@tp2.service restart running\n700 other.service start waiting\n")
    assert launch_node.unit_restarting("uma-vllm@tp2.service", runner) is True
    assert calls == [["systemctl", "list-jobs", "--no-legend", "--plain", "--no-pager"]]


def test_a_stop_job_or_another_units_restart_is_not():
    runner, _calls = _jobs("655 uma-vllm@tp2.service stop running\n656 uma-vllm@other.service restart running\n")
    assert launch_node.unit_restarting("uma-vllm@tp2.service", runner) is False
    runner, _calls = _jobs("")
    assert launch_node.unit_restarting("uma-vllm@tp2.service", runner) is False


def test_no_unit_or_no_systemctl_is_not_a_restart():
    def broken(*_a, **_kw):
        raise FileNotFoundError("systemctl")

    def hung(*_a, **_kw):
        raise subprocess.TimeoutExpired("systemctl", 3)

    assert launch_node.unit_restarting(None) is False
    assert launch_node.unit_restarting("uma-vllm@tp2.service", broken) is False
    assert launch_node.unit_restarting("uma-vllm@tp2.service", hung) is False


class FakeLink:
    rank = 0

    def __init__(self):
        self.told = []
        self.lost = None

    def notify(self, reason, deliberate):
        self.told.append((reason, deliberate))


def _stopped_launch(tmp_path, monkeypatch, restarting, down=False):
    config = node_helpers.launch_config(tmp_path, "MemTotal: 1 kB\nMemFree: 1 kB\nMemAvailable: 1 kB\n", guard=False)
    launch = uma_launch.Launch(config, uma_launch.Log("tp2", out=io.StringIO()))
    launch.link = FakeLink()
    launch.stop_signal = 15
    monkeypatch.setattr(uma_launch, "node_shutting_down", lambda: down)
    monkeypatch.setattr(uma_launch, "own_unit", lambda: "uma-vllm@tp2.service")
    monkeypatch.setattr(uma_launch, "unit_restarting", lambda unit: restarting and unit == "uma-vllm@tp2.service")
    launch.tell_peers()
    return launch


def test_systemctl_restart_tells_the_peers_to_restart_not_to_stop(tmp_path, monkeypatch):
    launch = _stopped_launch(tmp_path, monkeypatch, restarting=True)
    assert launch.link.told == [("rank 0: signal 15 (its unit restarts)", False)]


def test_systemctl_stop_is_still_a_deliberate_stop_of_every_rank(tmp_path, monkeypatch):
    launch = _stopped_launch(tmp_path, monkeypatch, restarting=False)
    assert launch.link.told == [("rank 0: signal 15", True)]


def test_a_node_going_down_is_a_restart_whatever_the_job(tmp_path, monkeypatch):
    launch = _stopped_launch(tmp_path, monkeypatch, restarting=False, down=True)
    assert launch.link.told == [("rank 0: signal 15 (this node is shutting down)", False)]
