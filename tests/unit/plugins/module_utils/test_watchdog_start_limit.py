# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog program carries out ``reset-start-limit`` (issue 19 item 3): healed restarts leave
systemd's start limit too, by ``systemctl reset-failed`` of the node's own unit, recorded in events.json
with the result. Stand-ins, named as such: systemd (records the calls, can fail), the status server,
the observation and the decision (the decision's own tests are in test_watchdog_logic.py)."""

from __future__ import annotations

import json

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic, probes
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as wd


class RecordingSystemd:
    """systemctl stand-in: remembers what was asked; reset-failed fails when told to."""

    runner = None

    def __init__(self, fail=False):
        self.calls = []
        self.fail = fail

    def reset_start_limit(self, unit):
        self.calls.append(("reset-failed", unit))
        if self.fail:
            raise UmaError("unit", unit, "systemctl reset-failed failed: Access denied", "Run as root.")

    def __getattr__(self, name):
        def call(unit, *_args):
            self.calls.append((name, unit))
            return {}

        return call


class FakeServer:
    def __init__(self, bind, port, key=None, say=None):
        self.published = {}

    def close(self):
        pass


def _dog(tmp_path, monkeypatch, systemd):
    monkeypatch.setattr(probes, "StatusServer", FakeServer)
    cfg = logic.validate({"engine": "tp2", "state_dir": str(tmp_path), "textfile_dir": None})
    dog = wd.Watchdog(cfg, systemd=systemd, clock=lambda: 1000.0, sleep=lambda s: None)
    dog.observe = lambda: {"unit": "active"}
    action = {"do": "reset-start-limit", "action": "budget-reset", "reason": "healthy for 600 s",
              "evidence": {"healed": 2}}  # fmt: skip
    monkeypatch.setattr(logic, "decide", lambda cfg, floors, state, obs, now: (state, [dict(action)]))
    return dog


def _events(dog):
    with open(dog.dir + "/events.json", encoding="utf-8") as handle:
        return json.load(handle)


def test_healed_restarts_reset_the_units_start_limit(tmp_path, monkeypatch):
    systemd = RecordingSystemd()
    dog = _dog(tmp_path, monkeypatch, systemd)
    dog.tick()
    assert systemd.calls == [("reset-failed", "uma-vllm@tp2.service")]
    event = [e for e in _events(dog) if e["action"] == "budget-reset"][-1]
    assert event["evidence"] == {"healed": 2, "start_limit_reset": "uma-vllm@tp2.service"}


def test_a_refused_reset_is_recorded_not_raised(tmp_path, monkeypatch):
    systemd = RecordingSystemd(fail=True)
    dog = _dog(tmp_path, monkeypatch, systemd)
    dog.tick()  # no exception: the watchdog keeps watching
    event = [e for e in _events(dog) if e["action"] == "budget-reset"][-1]
    assert "Access denied" in event["evidence"]["error"]
    assert event["evidence"]["start_limit_reset"] is None


def test_the_real_systemd_wrapper_says_when_systemctl_refused():
    """``Systemd.reset_start_limit`` runs ``systemctl reset-failed UNIT`` and raises on a refusal (the plain
    ``reset_failed`` ignores its exit status: a unit that is not failed is no error there)."""
    from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import Systemd

    seen = []

    def runner(argv):
        seen.append(argv)
        return (runner.rc, "", "Access denied" if runner.rc else "")

    runner.rc = 0
    systemd = Systemd(runner=runner)
    systemd.reset_start_limit("uma-vllm@tp2.service")
    assert seen[-1][-2:] == ["reset-failed", "uma-vllm@tp2.service"]
    runner.rc = 1
    with pytest.raises(UmaError, match="Access denied"):
        systemd.reset_start_limit("uma-vllm@tp2.service")
