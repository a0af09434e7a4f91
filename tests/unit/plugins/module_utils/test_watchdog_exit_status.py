# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The exit status of a rank's failed run when systemd restarts it between two watchdog ticks.

Found in molecule/cluster with ``vllm_service_restart_s: 3`` (shorter than the 5 s tick): the
watchdog never saw the unit inactive, systemd's ExecMainStatus was already the new run's 0, and the
recorded restart said "exit status None" instead of the rank link's 69. The launcher's own record
of the run that ended (``launches/<engine>/<stamp>/launch.json``) says it. Stand-ins, named as
such: systemd (a dict of unit properties the test moves on) and the launch records (files written
here in the launcher's layout); the watchdog's observe/decide/record are the real ones.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic, probes
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as wd


class MovingSystemd:
    """systemctl stand-in: the unit is always active; NRestarts is what the test sets."""

    runner = None

    def __init__(self):
        self.n_restarts = 0

    def show(self, unit, props):
        return {"ActiveState": "active", "SubState": "running", "MainPID": "100", "ControlGroup": "",
                "NRestarts": str(self.n_restarts), "Result": "success", "ExecMainStatus": "0",
                "InvocationID": "inv-%d" % self.n_restarts}  # fmt: skip

    def stop(self, unit):
        pass

    def start(self, unit):
        pass

    def reset_failed(self, unit):
        pass


def launch(state_dir, stamp, started, exit_code, extra=None):
    d = state_dir / "launches" / "tp2" / stamp
    d.mkdir(parents=True)
    record = {"engine": "tp2", "started_at_epoch": started, "exit_code": exit_code}
    record.update(extra or {})
    (d / "launch.json").write_text(json.dumps(record))
    return d


@pytest.fixture
def dog(tmp_path, monkeypatch):
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    gib16 = 16 << 20
    (proc / "meminfo").write_text("MemTotal: %d kB\nMemFree: %d kB\nMemAvailable: %d kB\n" % (24 << 20, gib16, gib16))
    (proc / "sys" / "vm" / "min_free_kbytes").write_text("67584\n")
    alive = {"ok": True, "reason": "1 process", "pids": [41]}
    monkeypatch.setattr(probes, "check_local", lambda cfg, show, runner=None: dict(alive))
    monkeypatch.setattr(probes, "probe_health", lambda cfg: {"ok": False, "latency_s": 0.01, "error": "starting"})
    cfg = logic.validate({"engine": "tp2", "meminfo_root": str(proc),
                          "state_dir": str(tmp_path / "state"), "textfile_dir": None,
                          "processes": [{"match": "VLLM::", "min": 1}]})  # fmt: skip
    systemd = MovingSystemd()
    return wd.Watchdog(cfg, systemd=systemd, clock=lambda: 0.0, sleep=lambda s: None), systemd, tmp_path / "state"


def test_a_restart_between_two_ticks_is_recorded_with_the_launchers_exit_code(dog):
    watchdog, systemd, state = dog
    assert watchdog.observe()["exit_status"] is None
    launch(state, "20261128T030000Z-100", 1000.0, 69)  # the rank link stopped this run: exit 69
    launch(state, "20261128T030004Z-200", 1004.0, None)  # the run systemd started 3 s later, running
    systemd.n_restarts = 1
    obs = watchdog.observe()
    assert obs["exit_status"] == 69
    assert watchdog.last_exit == 69  # kept for the ticks after (the give-up reason names it too)
    assert watchdog.observe()["exit_status"] == 69


def test_the_recorded_reason_names_the_exit_status_through_decide(dog):
    watchdog, systemd, records = dog
    # the first tick sees NRestarts 0
    state, _actions = logic.decide(watchdog.cfg, watchdog.floors, watchdog.state, watchdog.observe(), 0.0)
    launch(records, "20261128T030000Z-100", 1000.0, 69)
    launch(records, "20261128T030004Z-200", 1004.0, None)
    systemd.n_restarts = 1
    _state, actions = logic.decide(watchdog.cfg, watchdog.floors, state, watchdog.observe(), 5.0)
    reasons = [a["reason"] for a in actions if a.get("action") == "systemd-restart"]
    assert len(reasons) == 1 and "exit status 69" in reasons[0], actions


def test_no_restart_no_record_read(dog, monkeypatch):
    watchdog, _systemd, state = dog
    launch(state, "20261128T030000Z-100", 1000.0, 69)
    calls = []
    monkeypatch.setattr(wd, "last_launch_exit", lambda *a: calls.append(a) or 69)
    watchdog.observe()
    watchdog.observe()
    assert calls == [] and watchdog.last_exit is None


def test_the_running_launch_is_skipped_and_only_the_one_before_it_counts(tmp_path):
    launch(tmp_path, "20261128T020000Z-7", 900.0, 1)  # older than the last two: never reported
    launch(tmp_path, "20261128T030000Z-100", 1000.0, None)  # killed before it wrote its code (SIGKILL)
    launch(tmp_path, "20261128T030004Z-200", 1004.0, None)  # running
    assert wd.last_launch_exit(str(tmp_path), "tp2") is None
    launch(tmp_path, "20261128T030009Z-300", 1009.0, 69)  # the newest ended with 69, no new run yet
    assert wd.last_launch_exit(str(tmp_path), "tp2") == 69


def test_two_launches_in_one_second_are_ordered_by_their_start_time(tmp_path):
    # the stamp has a 1 s resolution and then the pid: pid 900 started before pid 80 here
    launch(tmp_path, "20261128T030000Z-900", 1000.1, 69)
    launch(tmp_path, "20261128T030000Z-80", 1000.9, None)
    assert wd.last_launch_exit(str(tmp_path), "tp2") == 69


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"[1, 2]", b'{"exit_code": true, "started_at_epoch": 5}',
                                     b'{"exit_code": "69", "started_at_epoch": 5}'])  # fmt: skip
def test_a_damaged_record_is_skipped_and_left_in_place(tmp_path, content):
    d = launch(tmp_path, "20261128T030004Z-200", 1004.0, None)
    bad = tmp_path / "launches" / "tp2" / "20261128T030009Z-300"
    bad.mkdir()
    (bad / "launch.json").write_bytes(content)
    assert wd.last_launch_exit(str(tmp_path), "tp2") is None
    assert (bad / "launch.json").read_bytes() == content and (d / "launch.json").exists()


def test_no_launches_directory_and_a_symlinked_record_give_none(tmp_path):
    assert wd.last_launch_exit(str(tmp_path), "tp2") is None
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"exit_code": 69, "started_at_epoch": 1.0}))
    d = tmp_path / "launches" / "tp2" / "20261128T030009Z-300"
    d.mkdir(parents=True)
    (d / "launch.json").symlink_to(target)
    (tmp_path / "launches" / "tp2" / "latest").symlink_to(d.name)
    assert wd.last_launch_exit(str(tmp_path), "tp2") is None
