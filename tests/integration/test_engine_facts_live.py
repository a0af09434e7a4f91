# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma.vllm.engine_facts for real: ansible-playbook over the docker connection against a lab node
(uma-lab/node:bookworm, systemd 252 as PID 1) with a real template unit, one engine running, one
installed and stopped, one unknown to systemd, watchdog configs and a stamps file.

The same play also runs the five tasks of roles/vllm_service the module replaces (find the drop-ins,
slurp the stamps, systemctl show, stat + find the watchdog configs) and asserts, on the node's own
answers, that the module returns what those tasks gave the role - and the same again in check mode.

Starts one container (``uma-it-engine-facts``) and removes it; run it under the lab lock like
every docker-using integration test. Missing docker or lab image: skipped, or FAILS when
UMA_REQUIRE_VLLM=1 (tests/all.sh sets it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_vllm_parser_oracle import IMAGE, ROOT, _require

NAME = "uma-it-engine-facts"
RUN_ARGS = [
    "--cap-add", "SYS_ADMIN", "--security-opt", "apparmor=unconfined", "--cgroupns", "host",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
    "--stop-signal", "SIGRTMIN+3",
]  # fmt: skip

NODE_SETUP = r"""
set -e
cat > /etc/systemd/system/uma-vllm@.service <<'EOF'
[Unit]
Description=engine-facts test %i
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
EOF
for e in run stopped; do
  mkdir -p /etc/systemd/system/uma-vllm@$e.service.d
  printf '[Service]\nEnvironment=E=%s\n' "$e" > /etc/systemd/system/uma-vllm@$e.service.d/engine.conf
done
echo 'not a drop-in directory' > /etc/systemd/system/uma-vllm@file.service.d
mkdir -p /etc/uma-vllm/watchdog /var/lib/uma-vllm
echo '{"engine": "run"}' > /etc/uma-vllm/watchdog/run.json
echo '{"engine": "old"}' > /etc/uma-vllm/watchdog/old.json
echo '{' > /etc/uma-vllm/watchdog/.run.json.tmp
echo '{"run": "u/d/e/j", "stopped": "u/d/e/k"}' > /var/lib/uma-vllm/vllm-service.json
systemctl daemon-reload
systemctl enable --now uma-vllm@run.service
"""

PLAY = """
- name: Engine facts against the roles' five read tasks
  hosts: all
  gather_facts: false
  vars:
    engines: [run, stopped, nope]
  tasks:
    - name: Old - find the engines installed on this node
      ansible.builtin.find:
        paths: /etc/systemd/system
        patterns: "uma-vllm@*.service.d"
        file_type: directory
      register: old_installed

    - name: Old - read what configuration each engine was started with
      ansible.builtin.slurp:
        src: /var/lib/uma-vllm/vllm-service.json
      register: old_stamps
      failed_when: false

    - name: Old - read the engines' unit states
      ansible.builtin.command:
        argv: "{{ ['systemctl', 'show', '-p', 'Id', '-p', 'ActiveState', '-p', 'UnitFileState']
                  + (engines | map('regex_replace', '^(.*)$', 'uma-vllm@\\\\1.service') | list) }}"
      register: old_units
      changed_when: false

    - name: Old - look for the watchdog config directory
      ansible.builtin.stat:
        path: /etc/uma-vllm/watchdog
      register: old_wd_dir

    - name: Old - find the watchdog configs on this node
      ansible.builtin.find:
        paths: /etc/uma-vllm/watchdog
        patterns: "*.json"
      register: old_wd
      when: old_wd_dir.stat.isdir | default(false)

    - name: New - one task
      uma.vllm.engine_facts:
        engines: "{{ engines }}"
      register: new

    - name: New - the same in check mode
      uma.vllm.engine_facts:
        engines: "{{ engines }}"
      register: new_check
      check_mode: true

    - name: New - garbled stamps
      uma.vllm.engine_facts:
        stamps_path: /etc/uma-vllm/watchdog/.run.json.tmp
      register: new_garbled

    - name: New - a bad engine name
      uma.vllm.engine_facts:
        engines: [run, "bad name"]
      register: new_bad
      failed_when: false

    - name: The module returns what the five tasks gave the role
      ansible.builtin.assert:
        that:
          - new is not changed and new_check is not changed
          - new.installed == (old_installed.files | map(attribute='path') | map('basename')
                              | map('regex_replace', '^uma-vllm@(.*)\\\\.service\\\\.d$', '\\\\1') | sort)
          - new.stamps == (old_stamps.content | b64decode | from_json)
          # systemctl show answers in the order it was asked
          - (engines | map('extract', new.units) | map(attribute='ActiveState') | list)
            == (old_units.stdout_lines | select('match', '^ActiveState=')
                | map('regex_replace', '^ActiveState=', '') | list)
          - (engines | map('extract', new.units) | map(attribute='UnitFileState') | list)
            == (old_units.stdout_lines | select('match', '^UnitFileState=')
                | map('regex_replace', '^UnitFileState=', '') | list)
          - (engines | map('extract', new.units) | map(attribute='Id') | list)
            == (old_units.stdout_lines | select('match', '^Id=') | map('regex_replace', '^Id=', '') | list)
          - new.watchdogs == (old_wd.files | map(attribute='path') | map('basename')
                              | map('regex_replace', '\\\\.json$', '') | sort)
          - new.watchdog_paths == (old_wd.files | map(attribute='path') | sort)
          - (new | dict2items | rejectattr('key', 'eq', 'invocation') | items2dict)
            == (new_check | dict2items | rejectattr('key', 'eq', 'invocation') | items2dict)
          - new_garbled.stamps == {} and new_garbled.units == {}
          - new_garbled.warnings | select('search', 'is not JSON') | list | length == 1
          - new_bad.units is not defined  # the module failed (failed_when: false hides only the flag)
          - "new_bad.msg is search(\\"option 'engines\\\\[1\\\\]' = 'bad name': is not an engine name\\")"
"""


def _docker(*args, check=True):
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def lab_node():
    _require()
    _docker("rm", "-f", NAME, check=False)
    _docker("run", "-d", "--name", NAME, "--hostname", NAME, *RUN_ARGS, IMAGE)
    try:
        deadline, state = time.monotonic() + 90, ""
        while time.monotonic() < deadline:
            state = _docker("exec", NAME, "systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.5)
        else:
            pytest.fail("systemd in %s did not boot (state %r)" % (NAME, state))
        setup = _docker("exec", NAME, "bash", "-c", NODE_SETUP, check=False)
        assert setup.returncode == 0, setup.stderr
        yield NAME
    finally:
        _docker("rm", "-f", NAME, check=False)


def test_engine_facts_on_real_systemd_match_the_roles_tasks(lab_node, tmp_path):
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    %s:\n      ansible_connection: community.docker.docker\n"
        "      ansible_python_interpreter: /usr/bin/python3\n" % lab_node
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    env["ANSIBLE_COLLECTIONS_PATH"] = str(ROOT / ".cache" / "collections")
    run = subprocess.run(
        ["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        plays = json.loads(run.stdout)["plays"]
    except (ValueError, KeyError):
        pytest.fail("ansible-playbook exited %d:\n%s\n%s" % (run.returncode, run.stdout[-4000:], run.stderr[-3000:]))
    tasks = {t["task"]["name"]: t["hosts"].get(lab_node, {}) for t in plays[0]["tasks"]}
    failed = {
        name: result for name, result in tasks.items() if result.get("failed") and name != "New - a bad engine name"
    }
    assert run.returncode == 0 and not failed, json.dumps(failed, indent=1)[-6000:] + run.stderr[-2000:]
    new = tasks["New - one task"]
    # what the node's real systemd said, not only that it agrees with the old tasks
    assert new["installed"] == ["run", "stopped"]
    assert new["watchdogs"] == ["old", "run"]
    assert new["watchdog_paths"] == ["/etc/uma-vllm/watchdog/old.json", "/etc/uma-vllm/watchdog/run.json"]
    assert new["stamps"] == {"run": "u/d/e/j", "stopped": "u/d/e/k"}
    assert new["units"] == {
        "run": {"Id": "uma-vllm@run.service", "ActiveState": "active", "UnitFileState": "enabled"},
        "stopped": {"Id": "uma-vllm@stopped.service", "ActiveState": "inactive", "UnitFileState": "disabled"},
        "nope": {"Id": "uma-vllm@nope.service", "ActiveState": "inactive", "UnitFileState": "disabled"},
    }
    assert (new["systemd_dir"], new["config_dir"], new["stamps_path"]) == (
        "/etc/systemd/system",
        "/etc/uma-vllm",
        "/var/lib/uma-vllm/vllm-service.json",
    )
    assert new["changed"] is False and "warnings" not in new
    assert tasks["The module returns what the five tasks gave the role"].get("failed") is not True
