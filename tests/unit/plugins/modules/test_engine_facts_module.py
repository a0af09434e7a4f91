# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma.vllm.engine_facts through main(): options, check mode, warnings, refusals.

systemctl is faked at AnsibleModule.run_command (the logic's own tests are in
tests/unit/plugins/module_utils/test_engine_facts.py; real systemd in
tests/integration/test_engine_facts_live.py).
"""

from __future__ import annotations

import json

import pytest
from ansible.module_utils import basic

from ansible_collections.uma.vllm.plugins.modules import engine_facts

OUT = "Id=uma-vllm@a.service\nActiveState=active\nUnitFileState=enabled\n"


@pytest.fixture
def systemctl(monkeypatch):
    calls = []

    def run_command(self, args, **kwargs):
        calls.append((list(args), kwargs))
        return 0, OUT, ""

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(
        basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/bin/" + name if name == "systemctl" else None
    )
    return calls


@pytest.fixture
def node(tmp_path):
    (tmp_path / "systemd" / "uma-vllm@a.service.d").mkdir(parents=True)
    (tmp_path / "etc" / "watchdog").mkdir(parents=True)
    (tmp_path / "etc" / "watchdog" / "a.json").write_text("{}")
    (tmp_path / "vllm-service.json").write_text(json.dumps({"a": "fp"}))
    return {
        "systemd_dir": str(tmp_path / "systemd"),
        "config_dir": str(tmp_path / "etc"),
        "stamps_path": str(tmp_path / "vllm-service.json"),
    }


@pytest.mark.parametrize("check_mode", [False, True])
def test_reads_everything_and_changes_nothing(run_module, systemctl, node, check_mode):
    failed, result = run_module(engine_facts, dict(node, engines=["a", "b"]), check_mode=check_mode)
    assert not failed and result["changed"] is False
    assert result["installed"] == ["a"] and result["watchdogs"] == ["a"]
    assert result["watchdog_paths"] == [node["config_dir"] + "/watchdog/a.json"]
    assert result["stamps"] == {"a": "fp"}
    assert result["units"] == {
        "a": {"Id": "uma-vllm@a.service", "ActiveState": "active", "UnitFileState": "enabled"},
        "b": {"ActiveState": "inactive", "UnitFileState": ""},
    }
    assert (result["systemd_dir"], result["config_dir"], result["stamps_path"]) == (
        node["systemd_dir"],
        node["config_dir"],
        node["stamps_path"],
    )
    [(argv, kwargs)] = systemctl
    assert argv[:2] == ["/bin/systemctl", "show"] and argv[-2:] == ["uma-vllm@a.service", "uma-vllm@b.service"]
    assert kwargs == {"handle_exceptions": False}


def test_defaults(run_module, systemctl, monkeypatch):
    seen = {}
    monkeypatch.setattr(
        engine_facts._engine_facts, "engine_facts", lambda params, runner, path: seen.update(params) or {}
    )
    failed, _unused = run_module(engine_facts, {})
    assert not failed
    assert seen == {
        "systemd_dir": "/etc/systemd/system",
        "config_dir": "/etc/uma-vllm",
        "stamps_path": "/var/lib/uma-vllm/vllm-service.json",
        "engines": [],
        "watchdog_units": False,
        "files": [],
        "read": [],
        "extra_units": [],
        "packages": [],
        "dpkg_status": "/var/lib/dpkg/status",
    }


def test_garbled_stamps_warn(run_module, systemctl, node, monkeypatch):
    warned = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: warned.append(text))
    with open(node["stamps_path"], "w") as handle:
        handle.write("{half")
    failed, result = run_module(engine_facts, node)
    assert not failed and result["stamps"] == {} and systemctl == []
    [warning] = warned
    assert warning.startswith(node["stamps_path"] + " is not JSON (") and "restart" in warning


def test_bad_engine_name_fails_cleanly(run_module, systemctl, node):
    failed, result = run_module(engine_facts, dict(node, engines=["a", "b;reboot"]))
    assert failed
    assert result["msg"].startswith("option 'engines[1]' = 'b;reboot': is not an engine name. Use 1-64 characters")
    assert systemctl == []


def test_systemctl_failure_fails_with_rc_and_stderr(run_module, node, monkeypatch):
    monkeypatch.setattr(
        basic.AnsibleModule, "run_command", lambda self, args, **kw: (1, "", "Failed to connect to bus")
    )
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/bin/systemctl")
    failed, result = run_module(engine_facts, dict(node, engines=["a"]))
    assert failed and "exited 1" in result["msg"] and "Failed to connect to bus" in result["msg"]
