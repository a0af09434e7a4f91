# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma.vllm.preflight (issue 10): whole-number role variables refused before ansible-core's
argument validation, which crashes on inf ("cannot convert Infinity to integer", no variable).

The last tests run the real roles through ansible-playbook with only the always-tagged tasks
(the preflight and ansible-core's validation): nothing on the machine changes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.uma.vllm.plugins.filter.role_args import int_problem, role_args_errors, role_args_names

ROOT = pathlib.Path(__file__).resolve().parents[4]
SPEC = {
    "x_port": {"type": "int", "default": 30},
    "x_name": {"type": "str"},
    "x_list": {"type": "list", "elements": "int"},
    "x_engines": {
        "type": "list",
        "elements": "dict",
        "options": {"name": {"type": "str"}, "port": {"type": "int"}, "plan": {"type": "dict"}},
    },
}

CRASHING = [float("inf"), float("-inf"), "inf", "-inf", "Infinity", " +infinity "]
NONSENSE = [float("nan"), "nan", 1e308, "1e999", 10**40, True, False, "\u0663", "\u00b2", "--5", 1.5, "", [], {}]
GOOD = [0, 1, 30, -5, "30", " 30 ", 30.0, 2**63 - 1]


@pytest.mark.parametrize("value", CRASHING)
def test_ansible_core_crashes_on_these_and_the_preflight_refuses_them(value):
    with pytest.raises(OverflowError):
        ArgumentSpecValidator({"x_port": {"type": "int"}}).validate({"x_port": value})
    (msg,) = role_args_errors({"x_port": value}, SPEC)
    assert msg.startswith("x_port = ") and "Fix: give a whole number, e.g. 30 (the default)" in msg


@pytest.mark.parametrize("value", NONSENSE)
def test_nonsense_core_takes_or_reports_without_a_fix_is_refused(value):
    (msg,) = role_args_errors({"x_port": value}, SPEC)
    assert msg.startswith("x_port = ") and "(type int)" in msg and "Fix:" in msg


@pytest.mark.parametrize("value", GOOD)
def test_whole_numbers_pass_and_core_takes_them(value):
    assert int_problem(value) is None
    result = ArgumentSpecValidator({"x_port": {"type": "int"}}).validate({"x_port": value})
    assert not result.error_messages


def test_nested_options_and_int_lists_name_the_element():
    errors = role_args_errors(
        {
            "x_name": "inf",  # not a number option: left to core
            "x_list": [1, float("inf")],
            "x_engines": [{"name": "a", "port": 8000}, {"name": "b", "port": "Infinity", "plan": {"k": float("inf")}}],
            "x_port": None,  # unset
        },
        SPEC,
    )
    assert len(errors) == 2
    assert errors[0].startswith('x_engines[1].port = "Infinity" is not a whole number')
    assert errors[1].startswith("x_list[1] = inf is not a finite number")


def test_names_are_the_variables_holding_a_whole_number():
    assert role_args_names(SPEC) == ["x_engines", "x_list", "x_port"]


def _play(tmp_path, role, values):
    (tmp_path / "vars.json").write_text(json.dumps(values, allow_nan=True))
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  vars_files: [vars.json]\n  roles:\n    - role: uma.vllm.%s\n"
        % role
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1")
    # only the always-tagged tasks run: the preflight and ansible-core's validation
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(play), "--tags", "uma-preflight-only"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("role", "name", "nested"),
    [
        ("vllm_service", "vllm_service_restart_s", None),
        ("node_prep", "node_prep_vfs_cache_pressure", None),
        ("launch_wrapper", "launch_wrapper_lock_timeout_s", None),
        ("launch_wrapper", "launch_wrapper_engines", "port"),
    ],
)
def test_the_real_role_names_variable_value_and_fix(tmp_path, role, name, nested):
    value = float("inf")  # JSON's Infinity, as YAML's .inf
    if nested:
        value = [{"name": "a", "command": ["vllm"], "model_path": "/m", nested: float("inf")}]
    proc = _play(tmp_path, role, {name: value})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "cannot convert Infinity" not in out
    shown = "%s[0].%s = inf" % (name, nested) if nested else "%s = inf" % name
    assert "uma.vllm.%s: %s is not a finite number (type int). Fix: give a whole number" % (role, shown) in out


def test_the_real_roles_pass_with_their_defaults(tmp_path):
    for role in ("vllm_service", "node_prep", "launch_wrapper"):
        proc = _play(tmp_path, role, {})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Check the whole-number variables of %s" % role in proc.stdout
