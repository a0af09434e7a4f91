"""Issue 21 item 5: playbooks/restore.yml says what it leaves and purges images and the model cache only
when asked; a value that is not a boolean is refused before anything changes (its first task)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["restore_purge_images", "restore_purge_model_cache"])
def test_a_purge_that_is_not_a_boolean_is_refused_first(tmp_path, name):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache/collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")  # fmt: skip
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(ROOT / "playbooks/restore.yml"),
         "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable,
         "-e", "ansible_become=false", "-e", json.dumps({name: "please"})],
        capture_output=True, text=True, env=env, timeout=180, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    assert [t["task"]["name"] for t in tasks][-1] == "Check restore_purge_images and restore_purge_model_cache"
    failed = [r for r in tasks[-1]["hosts"]["localhost"]["results"] if r.get("failed")]
    assert len(failed) == 1 and '%s = "please" is not a boolean. Fix:' % name in failed[0]["msg"]


def test_purges_default_off_and_reach_the_role():
    play = yaml.safe_load((ROOT / "playbooks/restore.yml").read_text())[0]
    engines = next(t for t in play["tasks"] if t["name"] == "Stop and remove the engines")
    assert engines["vars"]["vllm_service_purge_images"].startswith("{{ restore_purge_images | default(false)")
    assert engines["vars"]["vllm_service_purge_model_cache"].startswith("{{ restore_purge_model_cache | default(false)")
    defaults = yaml.safe_load((ROOT / "roles/vllm_service/defaults/main.yml").read_text())
    assert defaults["vllm_service_purge_images"] is False and defaults["vllm_service_purge_model_cache"] is False
    said = next(t for t in play["tasks"] if t["name"] == "Say what stays on the node")
    assert "Kept: packages installed by node_prep" in json.dumps(said)
