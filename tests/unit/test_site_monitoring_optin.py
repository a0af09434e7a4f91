"""Issue 21 item 5: site.yml installs uma.vllm.monitoring only when uma_monitoring is true (so a
give-up raises an alert); a value that is not a boolean is refused. The play is run as it is in
playbooks/site.yml (copied out alone) against this machine with uma_monitoring false or wrong."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _play():
    plays = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    (play,) = [p for p in plays if "uma_monitoring" in p["name"]]
    return play


def test_the_play_includes_monitoring_only_when_asked():
    play = _play()
    (include,) = [t for t in play["tasks"] if "ansible.builtin.include_role" in t]
    assert include["ansible.builtin.include_role"]["name"] == "uma.vllm.monitoring"
    assert include["when"] == "uma_monitoring | default(false) | bool"


@pytest.mark.parametrize(("value", "rc"), [("false", 0), ("maybe", 2)])
def test_the_play_runs(tmp_path, value, rc):
    play = dict(_play(), hosts="localhost")
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache/collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")  # fmt: skip
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(tmp_path / "play.yml"),
         "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable,
         "-e", json.dumps({"uma_monitoring": value})],
        capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == rc, proc.stdout + proc.stderr
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    if rc:
        assert 'uma_monitoring = "maybe" is not a boolean. Fix:' in tasks[-1]["hosts"]["localhost"]["msg"]
    else:
        assert tasks[-1]["hosts"]["localhost"].get("skipped") is True  # monitoring left out
