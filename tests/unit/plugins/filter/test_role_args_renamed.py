"""Issue 21: units in every variable name. The old names (vllm_service_restart_sec,
launch_wrapper_guard_interval, launch_wrapper_guard_max_duration, monitoring_interval) still work
through uma.vllm.preflight: their value goes to the new name with a deprecation warning; both names
set to different values, or an old value that cannot be converted, is refused naming the variables."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.filter import role_args as ra

ROOT = pathlib.Path(__file__).resolve().parents[4]


def _options(role):
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]


@pytest.mark.parametrize(
    ("role", "old", "value", "new", "expect"),
    [
        ("vllm_service", "vllm_service_restart_sec", 7, "vllm_service_restart_s", 7),
        ("launch_wrapper", "launch_wrapper_guard_interval", 0.2, "launch_wrapper_guard_interval_s", 0.2),
        ("launch_wrapper", "launch_wrapper_guard_max_duration", 900, "launch_wrapper_guard_max_duration_s", 900),
        ("monitoring", "monitoring_interval", "15s", "monitoring_interval_s", 15),
        ("monitoring", "monitoring_interval", "1min", "monitoring_interval_s", 60),
        ("monitoring", "monitoring_interval", "2 h", "monitoring_interval_s", 7200),
        ("monitoring", "monitoring_interval", 30, "monitoring_interval_s", 30),
    ],
)
def test_an_old_name_sets_the_new_one_with_a_deprecation(role, old, value, new, expect):
    options = _options(role)
    assert old not in options and new in options  # the spec documents the new name only
    facts, messages, errors = ra.renamed_values(role, {old: value, new: options[new].get("default")}, options)
    assert facts == {new: expect} and errors == []
    assert len(messages) == 1 and old in messages[0] and new in messages[0] and "deprecated" in messages[0]


def test_unset_old_names_change_nothing():
    options = _options("vllm_service")
    values = {"vllm_service_restart_sec": ra.UNSET, "vllm_service_restart_s": 30}
    assert ra.renamed_values("vllm_service", values, options) == ({}, [], [])
    assert ra.renamed_values("node_prep", {}, _options("node_prep")) == ({}, [], [])


def test_both_names_set_differently_is_refused_naming_both():
    options = _options("vllm_service")
    values = {"vllm_service_restart_sec": 7, "vllm_service_restart_s": 12}
    facts, _messages, errors = ra.renamed_values("vllm_service", values, options)
    assert facts == {} and len(errors) == 1
    assert "vllm_service_restart_sec = 7 and its new name vllm_service_restart_s = 12" in errors[0]
    assert "Fix: keep vllm_service_restart_s only" in errors[0]
    # the same value under both names is fine
    assert ra.renamed_values("vllm_service", dict(values, vllm_service_restart_s=7), options)[2] == []


@pytest.mark.parametrize("bad", ["500ms", "0s", "soon", True, -5, "15 parsecs"])
def test_an_old_interval_that_is_not_whole_seconds_is_refused(bad):
    _facts, _messages, errors = ra.renamed_values("monitoring", {"monitoring_interval": bad}, _options("monitoring"))
    assert len(errors) == 1 and errors[0].startswith("monitoring_interval = ")
    assert "Fix: use monitoring_interval_s" in errors[0]


def test_the_filter_raises_on_errors_and_returns_the_facts():
    options = _options("vllm_service")
    with pytest.raises(Exception, match="are both set"):
        ra.role_args_renamed({"vllm_service_restart_sec": 7, "vllm_service_restart_s": 12}, "vllm_service", options)
    assert ra.role_args_renamed({"vllm_service_restart_sec": 7}, "vllm_service", options) == {
        "vllm_service_restart_s": 7
    }
    assert ra.role_args_renamed_names("monitoring") == ["monitoring_interval", "monitoring_interval_s"]


def _play(tmp_path, role, values):
    (tmp_path / "vars.json").write_text(json.dumps(values))
    play = tmp_path / "play.yml"
    new = [ra.RENAMED[role][old][0] for old in sorted(ra.RENAMED[role])]
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  vars_files: [vars.json]\n  roles:\n    - role: uma.vllm.%s\n"
        "  post_tasks:\n    - ansible.builtin.debug:\n        msg: 'NEW=%s'\n      tags: [uma-preflight-only]\n"
        % (role, "{{ [%s] | to_json }}" % ", ".join(new))
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(play), "--tags", "uma-preflight-only"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_the_real_roles_take_the_old_names(tmp_path):
    """Through ansible-playbook: the preflight dependency of each role sets the new name and warns."""
    for role, values, shown in (
        ("vllm_service", {"vllm_service_restart_sec": 7}, "NEW=[7]"),
        ("launch_wrapper", {"launch_wrapper_guard_max_duration": 900}, "NEW=[0.1, 900]"),
        ("monitoring", {"monitoring_interval": "1min"}, "NEW=[60]"),
    ):
        proc = _play(tmp_path, role, values)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert shown in out, out
        assert "[DEPRECATION WARNING]: uma.vllm.%s: the variable %s is deprecated" % (role, next(iter(values))) in out


def test_the_real_role_refuses_both_names(tmp_path):
    proc = _play(tmp_path, "vllm_service", {"vllm_service_restart_sec": 7, "vllm_service_restart_s": 12})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "vllm_service_restart_sec = 7 and its new name vllm_service_restart_s = 12 are both set" in out
