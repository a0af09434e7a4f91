"""uma.vllm.node_files as Ansible runs it.

In-process (the conftest's run_module): the argument spec and the refusals. Through
ansible-playbook (local connection, AnsiballZ payload, files under tmp_path): check mode,
the run, the re-run with no change, --diff with a secret file whose content must not appear
in anything ansible-playbook prints, and the programs installed from the payload.
"""

from __future__ import annotations

import base64
import grp
import json
import os
import pwd
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils.plumbing.node_install import package_dirs, program_names
from ansible_collections.uma.vllm.plugins.modules import node_files

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))
USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name
SECRET = "HF_TOKEN=hf_pl4ybook-secret-value-42\n"


def args(tmp_path, secret=SECRET, mode="0644"):
    etc = tmp_path / "etc"
    own = {"owner": USER, "group": GROUP}
    return {
        "directories": [dict(own, path=str(etc)), dict(own, path=str(etc / "engines"), mode="0750")],
        "files": [dict(own, path=str(etc / "engines" / "a.json"), content='{"a": 1}\n', mode=mode)],
        "secret_files": [dict(own, path=str(etc / "engines" / "a.env"), content=secret)],
    }


def test_in_process_run_then_no_change(tmp_path, run_module):
    failed, first = run_module(node_files, args(tmp_path))
    assert not failed and first["changed"] and len(first["changed_paths"]) == 4
    assert first["programs"] is None
    failed, second = run_module(node_files, args(tmp_path))
    assert not failed and second["changed"] is False and second["changed_paths"] == []


def test_an_unquoted_mode_is_refused_with_the_fix(tmp_path, run_module):
    failed, result = run_module(node_files, args(tmp_path, mode=420))
    assert failed and result["option"] == "files[0].mode"
    assert result["msg"].startswith("option 'files[0].mode' = 420: is a number, not an octal string")
    assert "quote it in YAML" in result["msg"]
    assert not (tmp_path / "etc").exists()


def test_a_missing_path_is_ansibles_own_clean_refusal(tmp_path, run_module):
    failed, result = run_module(node_files, {"files": [{"content": "x"}]})
    assert failed and "path" in result["msg"]


def playbook(tmp_path, module_args, *flags):
    """Run the module in a play on localhost; returns (returncode, stdout+stderr, registered result)."""
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "Files", "uma.vllm.node_files": module_args, "register": "r"},
        {"name": "Show", "ansible.builtin.debug": {"msg": "{{ r | to_json | b64encode }}"}},
    ]}]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache", "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))  # fmt: skip
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=%s" % sys.executable, str(tmp_path / "play.yml"), *flags],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    found = re.search(r'msg: ([A-Za-z0-9+/=]+)|"msg": "([A-Za-z0-9+/=]+)"', out)
    result = None
    if found:
        result = json.loads(base64.b64decode(found.group(1) or found.group(2)))
    return done.returncode, out, result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """check mode, the run with --diff, the re-run, a secret change with --diff, a bad mode."""
    tmp = tmp_path_factory.mktemp("node-files-play")
    module_args = dict(args(tmp), programs=True, lib_dir=str(tmp / "lib"))
    found = {"tmp": tmp}
    found["check"] = playbook(tmp, module_args, "--check", "--diff")
    found["check_left"] = sorted(os.listdir(tmp))
    found["run"] = playbook(tmp, module_args, "--diff")
    lib = tmp / "lib"
    installed = sorted(os.path.relpath(os.path.join(d, f), str(lib)) for d, _s, fs in os.walk(lib) for f in fs)
    found["run_left"] = ((tmp / "etc" / "engines" / "a.env").read_text(), installed)
    found["again"] = playbook(tmp, module_args)
    changed = dict(module_args, secret_files=args(tmp, secret=SECRET.replace("42", "43"))["secret_files"])
    found["secret"] = playbook(tmp, changed, "--diff")
    found["bad"] = playbook(tmp, dict(module_args, files=[dict(module_args["files"][0], mode=644)]))
    return found


def test_check_mode_predicts_and_writes_nothing(runs):
    code, out, result = runs["check"]
    assert code == 0, out[-3000:]
    assert runs["check_left"] == ["play.yml"]
    assert result["changed"] is True
    # the 4 entries, lib_dir, the node package's directories and every file that ships
    assert len(result["changed_paths"]) == 4 + 1 + len(package_dirs("/x")) + len(program_names())


def test_the_run_writes_what_check_mode_predicted(runs):
    code, out, result = runs["run"]
    assert code == 0, out[-3000:]
    assert result["changed_paths"] == runs["check"][2]["changed_paths"]
    assert result["files"] == runs["check"][2]["files"]
    assert runs["run_left"] == (SECRET, sorted(program_names()))
    assert "+directory 0750 %s:%s" % (USER, GROUP) in out  # the diff as Ansible prints it


def test_the_rerun_changes_nothing(runs):
    code, out, result = runs["again"]
    assert code == 0, out[-3000:]
    assert result["changed"] is False and result["changed_paths"] == []
    assert result["programs"]["fingerprint"] == runs["run"][2]["programs"]["fingerprint"]
    assert re.search(r"localhost\s*:\s*ok=2\s+changed=0", out)


def test_a_secret_never_reaches_the_output(runs):
    code, out, result = runs["secret"]
    assert code == 0, out[-3000:]
    target = str(runs["tmp"] / "etc" / "engines" / "a.env")
    assert result["changed_paths"] == [target]
    assert "(secret content before, %d bytes)" % len(SECRET) in out
    for name in ("check", "run", "again", "secret", "bad"):
        assert "pl4ybook" not in runs[name][1], name
        assert "pl4ybook" not in json.dumps(runs[name][2]), name  # the result, decoded


def test_a_bad_mode_fails_cleanly_and_changes_nothing(runs):
    code, out, _result = runs["bad"]
    assert code != 0
    assert "option 'files[0].mode' = 644: is a number, not an octal string" in out
    assert "Traceback" not in out and "MODULE FAILURE" not in out
    assert (runs["tmp"] / "etc" / "engines" / "a.env").read_text() == SECRET.replace("42", "43")


def test_the_invocation_is_not_logged_on_the_node(tmp_path, run_module, monkeypatch):
    """AnsibleModule logs its invocation to the node's journal; a multi-line secret in a list
    option is not masked there (str(list) escapes its line breaks), so the module logs none."""
    from ansible.module_utils import basic

    logged = []
    monkeypatch.setattr(basic.AnsibleModule, "log", lambda self, msg, log_args=None: logged.append(msg))
    multi_line = '# managed\nHF_TOKEN="hf_canary-journal-77"\nOTHER=x\n'
    failed, result = run_module(node_files, args(tmp_path, secret=multi_line))
    assert not failed and result["changed"]
    assert not [m for m in logged if "hf_canary-journal-77" in m], logged
    assert not [m for m in logged if m.startswith("Invoked")], logged
