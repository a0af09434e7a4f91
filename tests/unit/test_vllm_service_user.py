# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_service_user (issue 10) through the real role on localhost: refusals that happen before
anything on the node changes, and the unit's hardening rendered by Ansible's own template engine.
(The engine really running as the user is proven in molecule/launch_wrapper.)"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def play(tmp_path, body, extra=()):
    (tmp_path / "play.yml").write_text(body)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(tmp_path / "play.yml"), *extra],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180, check=False,
    )  # fmt: skip


def test_a_non_root_user_with_the_container_runtime_is_refused_first(tmp_path):
    proc = play(
        tmp_path,
        """- hosts: localhost
  gather_facts: false
  vars:
    vllm_service_user: uma-vllm
    uma_ram_gib: 100
    vllm_service_engines: [{name: main, model_path: /models/x, port: 8000}]
  roles: [uma.vllm.vllm_service]
""",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert 'vllm_service_user = "uma-vllm" needs the native runtime' in out
    assert "Fix: set vllm_service_runtime: native" in out
    assert "TASK [uma.vllm.vllm_service : Plan each engine" not in out  # refused before anything else


@pytest.mark.parametrize(("user", "hardened"), [("root", False), ("uma-vllm", True)])
def test_the_unit_gets_the_user_hardening_only_for_a_non_root_user(tmp_path, user, hardened):
    role = ROOT / "roles" / "vllm_service"
    dest = tmp_path / "uma-vllm@.service"
    proc = play(
        tmp_path,
        """- hosts: localhost
  gather_facts: false
  vars_files: [%s, %s]
  tasks:
    - name: Render the template unit with the role's defaults and vars
      ansible.builtin.template:
        src: %s
        dest: %s
        mode: "0644"
"""
        % (
            role / "defaults" / "main.yml",
            role / "vars" / "main.yml",
            role / "templates" / "uma-vllm@.service.j2",
            dest,
        ),
        extra=["-e", "vllm_service_user=" + user],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dest.read_text().splitlines()
    assert "NoNewPrivileges=yes" in lines and "ProtectSystem=full" in lines
    assert ("ProtectHome=yes" in lines) is hardened
    assert any(line.startswith("CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_KILL") for line in lines) is hardened
    assert any(line.startswith("SystemCallFilter=~@clock") for line in lines) is hardened
    assert not any(line.startswith("User=") for line in lines)  # the launcher stays root; it drops for the engine


def test_the_engine_config_carries_the_user_only_when_one_is_set(tmp_path):
    (tmp_path / "engines").mkdir()
    proc = play(
        tmp_path,
        """- hosts: localhost
  gather_facts: false
  tasks:
    - name: Write two engine configs as vllm_service does
      ansible.builtin.include_role:
        name: uma.vllm.launch_wrapper
        tasks_from: engine
      vars:
        launch_wrapper_config_dir: %s
        launch_wrapper_engine: "{{ item }}"
      loop:
        - {name: asroot, command: [vllm, serve], model_path: /m, port: 8000, user: null, groups: null}
        - {name: asuser, command: [vllm, serve], model_path: /m, port: 8001, user: uma-vllm, groups: [video, render],
           home: /var/lib/uma-vllm/engine-home, group: null}
"""
        % tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    asroot = json.loads((tmp_path / "engines" / "asroot.json").read_text())
    asuser = json.loads((tmp_path / "engines" / "asuser.json").read_text())
    # unset: no key at all (configs written before this option stay the same, no restart)
    assert not [k for k in asroot if k.startswith("engine_")]
    assert asuser["engine_user"] == "uma-vllm" and asuser["engine_groups"] == ["video", "render"]
    assert asuser["engine_home"] == "/var/lib/uma-vllm/engine-home" and asuser["engine_group"] is None
