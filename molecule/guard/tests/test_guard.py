"""State of the guard node after converge, the container restart and the interrupted play.

Runs as its own process after side_effect.yml exited: guard "late" was started by
that play, the "interrupted" window was opened by an ansible-playbook that was killed.
The order of the tests matters (pytest keeps file order): "late" is looked at first,
while it still runs.
"""

from __future__ import annotations

import json
import time

FACTS = "/var/lib/uma-test"
RUN = "/run/uma-vllm"


def _json(host, path):
    f = host.file(path)
    assert f.exists, path
    return json.loads(f.content_string)


def _wait(predicate, timeout, step=1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def test_late_guard_outlived_the_play_that_started_it(host):
    # side_effect.yml, which started it, has exited: the guard runs under the node's systemd
    assert host.service("uma-guard-late.service").is_running
    status = _json(host, RUN + "/guard-late.json")
    assert status["state"] == "running" and status["name"] == "late"
    procs = host.run("pgrep -f 'uma_guard[.]py --name late '")
    assert len(procs.stdout.split()) == 1


def test_late_guard_stops_by_itself_at_max_duration(host):
    def stopped():
        status = json.loads(host.file(RUN + "/guard-late.json").content_string)
        return status if status["state"] == "stopped" else None

    status = _wait(stopped, timeout=60)
    assert status, "guard 'late' did not stop within its max_duration (30 s)"
    assert status["stop_reason"] == "max_duration"
    assert 29 <= status["elapsed_s"] <= 40
    assert status["ticks"] > 0 and status["cpu_seconds"] < 10
    assert not host.service("uma-guard-late.service").is_running
    assert host.run("pgrep -f 'uma_guard[.]py --name late '").rc == 1


def test_interrupted_window_is_restored_by_the_nodes_timer(host):
    record = _json(host, FACTS + "/interrupted.json")
    device = record["devices"][0]
    knob = "/sys/block/%s/queue/read_ahead_kb" % device["device"]

    def restored():
        return not host.file("/var/lib/uma-vllm/readahead-interrupted.json").exists

    assert _wait(restored, timeout=record["duration"] + 40), "the window's timer did not restore the device"
    assert int(host.file(knob).content_string) == device["original_kb"]
    assert host.file("/sys/block/%s/dev" % device["device"]).content_string.strip() == device["dev"]
    log = host.run("journalctl -u uma-readahead-restore-interrupted.service -o cat --no-pager").stdout
    restore = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert restore and restore[-1]["results"][0]["restored"][0]["device"] == device["device"]
    # the transient timer and service are gone after the window
    assert not host.service("uma-readahead-restore-interrupted.timer").is_running


def test_outlive_guard_stopped_when_its_process_exited(host):
    before = _json(host, FACTS + "/before-restart.json")
    assert before["outlive"]["state"] == "stopped"
    assert before["outlive"]["stop_reason"] == "until_pid"


def test_container_restart_left_no_throttled_device_and_no_guard(host):
    before = _json(host, FACTS + "/before-restart.json")
    after = _json(host, FACTS + "/after-restart.json")
    original = before["record"]["devices"][0]["original_kb"]
    assert before["live_kb"] == 8 and original != 8
    assert after["live_kb"] == original
    assert after["record_left"] is False
    assert after["guard_pids"] == [] and after["steady"] == "inactive"
    assert '"restored"' in after["boot_log"]


def test_boot_unit_is_installed_and_enabled(host):
    unit = host.file("/etc/systemd/system/uma-readahead-restore.service")
    assert unit.exists and unit.mode == 0o644
    assert "Managed by uma.vllm" in unit.content_string.splitlines()[0]
    assert "restore --all --state-dir /var/lib/uma-vllm" in unit.content_string
    assert host.service("uma-readahead-restore.service").is_enabled


def test_udev_rule_holds_the_steady_state_value(host):
    before = _json(host, FACTS + "/before-restart.json")
    device = before["record"]["devices"][0]
    rules = host.file("/etc/udev/rules.d/60-uma-vllm-readahead.rules")
    assert rules.exists and rules.mode == 0o644
    line = 'KERNEL=="%s", ATTR{queue/read_ahead_kb}="%d"' % (device["device"], device["original_kb"])
    assert line in rules.content_string


def test_node_programs_are_installed(host):
    for name in ("uma_guard.py", "uma_vllm_node/base/common.py", "uma_vllm_node/guard/program.py"):
        f = host.file("/usr/local/lib/uma-vllm/" + name)
        assert f.exists and f.mode == 0o644 and f.user == "root"
    assert not host.file("/usr/local/lib/uma-vllm/__pycache__").exists


def test_no_window_record_is_left(host):
    assert host.run("ls /var/lib/uma-vllm/readahead-*.json").rc != 0


def test_refused_guard_never_ran(host):
    assert host.run("systemctl cat uma-guard-bad.service").rc != 0
    assert not host.file(RUN + "/guard-bad.json").exists
