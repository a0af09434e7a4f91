# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma.vllm.model_fetch with each of its REAL clients against a STAND-IN FOR THE HUB.

No model hub is reachable here, so lab/hub_standin.py (stdlib http.server) serves a real
tiny safetensors model made by lab/make_model.py on 127.0.0.1, redirecting its LFS files to
a signed URL on another origin as the Hub does (``cdn=True``: the "CDN" refuses a request
that carries the token). Each test runs with both clients (``client``): the module's own
(``builtin``, urllib) and the real ``huggingface_hub`` (``HfApi.model_info`` +
``snapshot_download``); the hashing, the free-space check and the manifest are the real
ones. One test runs the module through the ``ansible`` command with -vvv and checks that
the token is in none of its output; the last ones interrupt the built-in client's download.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf
from ansible_collections.uma.vllm.plugins.modules import model_fetch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "lab"))
import hub_standin

TOKEN = "hf_standinSecretToken0123456789"
REPO = "lab/tiny-llama"
GATED = "lab/tiny-llama-gated"


class _Exit(Exception):
    def __init__(self, failed, result):
        super().__init__(result.get("msg", ""))
        self.failed, self.result = failed, result


def _exit(self, **kw):
    kw.setdefault("changed", False)
    raise _Exit(False, kw)


def _fail(self, msg, **kw):
    kw.update(msg=msg, failed=True)
    raise _Exit(True, kw)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("hub") / "tiny-llama"
    subprocess.run(
        [sys.executable, os.path.join(ROOT, "lab", "make_model.py"), "--out", str(out), "--shards", "2"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return str(out)


@pytest.fixture(params=["builtin", "huggingface_hub"])
def hub(request, model, tmp_path, monkeypatch):
    gated_dir = tmp_path / "gated"
    shutil.copytree(model, gated_dir)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    server = hub_standin.serve({REPO: model, GATED: str(gated_dir)}, gated=(GATED,), token=TOKEN, cdn=True)
    server.client = request.param
    yield server
    server.shutdown()
    server.server_close()


def run(args, check_mode=False, monkeypatch=None):
    full = dict(args, _ansible_check_mode=check_mode, _ansible_diff=True)
    with patch_module_args(full):
        old = basic.AnsibleModule.exit_json, basic.AnsibleModule.fail_json
        basic.AnsibleModule.exit_json, basic.AnsibleModule.fail_json = _exit, _fail
        try:
            model_fetch.main()
        except _Exit as done:
            return done.failed, done.result
        finally:
            basic.AnsibleModule.exit_json, basic.AnsibleModule.fail_json = old
    raise AssertionError("main() returned without exit_json/fail_json")


def listing(dest):
    out = {}
    for base, dirs, names in os.walk(dest):
        dirs[:] = [d for d in dirs if d != ".cache"]
        for name in names:
            full = os.path.join(base, name)
            out[os.path.relpath(full, dest)] = os.path.getsize(full)
    return out


def test_download_then_unchanged_then_corruption_found(hub, model, tmp_path):
    dest = str(tmp_path / "dest")
    args = {"repo_id": REPO, "dest": dest, "endpoint": hub.endpoint, "client": hub.client}
    failed, res = run(args, check_mode=True)
    assert not failed and res["changed"] and not os.path.exists(dest), res
    assert res["download"]["done"] is False and res["download"]["bytes"] > 0

    failed, res = run(args)
    assert not failed and res["changed"], res
    shards = sorted(n for n in os.listdir(model) if n.endswith(".safetensors"))
    assert len(shards) == 2
    for shard in shards:
        assert mf.sha256_of(os.path.join(dest, shard)) == mf.sha256_of(os.path.join(model, shard))
    manifest = json.load(open(os.path.join(dest, mf.MANIFEST)))
    assert manifest["commit"] == res["commit"] == hub.repos[REPO].commit
    assert sorted(manifest["files"]) == sorted(f["name"] for f in res["files"])
    assert manifest["files"][shards[0]]["sha256"] == mf.sha256_of(os.path.join(model, shards[0]))

    gets = len([e for e in hub.log if e["method"] == "GET" and "/resolve/" in str(e["path"])])
    failed, res = run(dict(args, verify=True))
    assert not failed and not res["changed"], res
    assert res["verified"] == shards and res["download"]["files"] == []
    assert len([e for e in hub.log if e["method"] == "GET" and "/resolve/" in str(e["path"])]) == gets

    # flip one byte in the middle of a shard (same size): only verify finds it, naming the file
    victim = os.path.join(dest, shards[1])
    with open(victim, "r+b") as handle:
        handle.seek(os.path.getsize(victim) // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))
    failed, res = run(dict(args, verify=True))
    assert failed and victim in res["msg"] and "verify" in res["msg"] and "damaged" in res["msg"], res

    # a truncated shard has the wrong size: the next run downloads it again and the result is whole
    with open(victim, "r+b") as handle:
        handle.truncate(100)
    failed, res = run(args)
    assert not failed and res["changed"] and res["download"]["files"] == [shards[1]], res
    assert mf.sha256_of(victim) == mf.sha256_of(os.path.join(model, shards[1]))


def test_new_commit_downloads_the_changed_file(hub, model, tmp_path):
    source = tmp_path / "moving"
    shutil.copytree(model, source)
    hub.repos["lab/moving"] = hub_standin.Repo("lab/moving", str(source))
    dest = str(tmp_path / "dest")
    args = {"repo_id": "lab/moving", "dest": dest, "endpoint": hub.endpoint, "client": hub.client}
    failed, first = run(args)
    assert not failed and first["changed"]
    config = json.loads((source / "config.json").read_text())
    config["uma_test_marker"] = 1
    (source / "config.json").write_text(json.dumps(config))
    hub.repos["lab/moving"].rescan()
    failed, res = run(args, check_mode=True)
    assert (
        not failed
        and res["changed"]
        and res["commit"] != first["commit"]
        and res["download"]["files"] == ["config.json"]
    )
    assert "commit: %s" % first["commit"] in res["diff"]["before"] and res["commit"] in res["diff"]["after"]
    failed, res = run(args)
    assert not failed and res["changed"] and json.load(open(os.path.join(dest, "config.json")))["uma_test_marker"] == 1


def test_gated_without_token_refused_with_token_works(hub, tmp_path, capfd):
    dest = str(tmp_path / "dest")
    args = {"repo_id": GATED, "dest": dest, "endpoint": hub.endpoint, "client": hub.client}
    failed, res = run(args)
    assert failed and "token_file" in res["msg"] and "gated" in res["msg"] and not os.path.exists(dest), res

    token_file = tmp_path / "hf_token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    failed, res = run(dict(args, token_file=str(token_file)))
    assert failed and "token_file" in res["msg"] and "0644" in res["msg"] and TOKEN not in json.dumps(res)

    token_file.chmod(0o600)
    failed, res = run(dict(args, token_file=str(token_file)))
    assert not failed and res["changed"] and res["gated"], res
    assert TOKEN not in json.dumps(res)
    assert any(e["authorised"] for e in hub.log if "/resolve/" in str(e["path"]))
    # the shards came from the "CDN" (another origin), which refuses a request carrying the token
    cdn = [e for e in hub.log if str(e["path"]).startswith("/cdn/")]
    assert cdn and not any(e["authorised"] for e in cdn), hub.log
    out, err = capfd.readouterr()
    assert TOKEN not in out + err
    for base, _dirs, names in os.walk(dest):
        for name in names:
            with open(os.path.join(base, name), "rb") as handle:
                assert TOKEN.encode() not in handle.read(), name

    wrong = tmp_path / "wrong_token"
    wrong.write_text("hf_wrongWrongWrong0000")
    wrong.chmod(0o600)
    failed, res = run(
        {
            "repo_id": GATED,
            "dest": str(tmp_path / "d2"),
            "endpoint": hub.endpoint,
            "token_file": str(wrong),
            "client": hub.client,
        }
    )
    assert failed and "token_file" in res["msg"] and "hf_wrongWrongWrong0000" not in json.dumps(res), res


def test_too_small_disk_refused_before_any_byte(hub, tmp_path, monkeypatch):
    dest = str(tmp_path / "dest")
    real_plan = mf.plan
    monkeypatch.setattr(
        mf, "plan", lambda request, client, **kw: real_plan(request, client, free=lambda _path: 1000, **kw)
    )
    failed, res = run({"repo_id": REPO, "dest": dest, "endpoint": hub.endpoint, "client": hub.client})
    assert failed and "'dest'" in res["msg"] and dest in res["msg"] and "1000 bytes" in res["msg"], res
    assert "needs" in res["msg"] and not os.path.exists(dest)
    assert not [e for e in hub.log if "/resolve/" in str(e["path"])]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root to mount a tmpfs")
def test_too_small_tmpfs_refused_before_any_byte(hub, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=False).returncode:
        pytest.fail("mount -t tmpfs failed")
    try:
        dest = str(small / "model")
        failed, res = run({"repo_id": REPO, "dest": dest, "endpoint": hub.endpoint, "client": hub.client})
        assert failed and dest in res["msg"] and "free" in res["msg"], res
        assert os.listdir(str(small)) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_through_ansible_token_in_no_output(hub, tmp_path):
    token_file = tmp_path / "hf_token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    dest = str(tmp_path / "dest")
    module_args = "repo_id=%s dest=%s endpoint=%s token_file=%s verify=true client=%s" % (
        GATED, dest, hub.endpoint, token_file, hub.client)  # fmt: skip
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    proc = subprocess.run(
        [
            "ansible",
            "localhost",
            "-vvv",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=%s" % sys.executable,
            "-m",
            "uma.vllm.model_fetch",
            "-a",
            module_args,
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CHANGED" in proc.stdout and TOKEN not in proc.stdout + proc.stderr
    assert os.path.isfile(os.path.join(dest, mf.MANIFEST))


@pytest.fixture
def builtin_hub(model, tmp_path):
    server = hub_standin.serve({REPO: model}, cdn=True)
    yield server
    server.shutdown()
    server.server_close()


def test_a_lost_connection_is_resumed_with_a_range(builtin_hub, model, tmp_path):
    """Every file's first GET ends early (the stand-in closes the connection): the built-in client asks
    again from where it stopped, and the result is whole."""
    builtin_hub.cut_after = 1000
    dest = str(tmp_path / "dest")
    failed, res = run({"repo_id": REPO, "dest": dest, "endpoint": builtin_hub.endpoint})
    assert not failed and res["changed"], res
    shards = sorted(n for n in os.listdir(model) if n.endswith(".safetensors"))
    for shard in shards:
        assert mf.sha256_of(os.path.join(dest, shard)) == mf.sha256_of(os.path.join(model, shard))
        ranged = [e for e in builtin_hub.log if str(e["path"]).endswith("/" + shard) and e["range"]]
        assert [e["range"] for e in ranged if str(e["path"]).startswith("/cdn/")] == ["bytes=1000-"], builtin_hub.log
    assert not os.path.exists(os.path.join(dest, ".cache")), os.listdir(dest)


def test_a_killed_run_s_partial_file_is_resumed_by_the_next_run(builtin_hub, model, tmp_path):
    """A run killed mid-file leaves dest/.cache/uma-hub/NAME.part: the next run asks only for the rest."""
    dest = tmp_path / "dest"
    shard = sorted(n for n in os.listdir(model) if n.endswith(".safetensors"))[0]
    data = open(os.path.join(model, shard), "rb").read()
    part = dest / ".cache" / "uma-hub" / (shard + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(data[: len(data) // 2])
    failed, res = run({"repo_id": REPO, "dest": str(dest), "endpoint": builtin_hub.endpoint})
    assert not failed and res["changed"], res
    assert mf.sha256_of(str(dest / shard)) == mf.sha256_of(os.path.join(model, shard))
    asked = [e["range"] for e in builtin_hub.log if str(e["path"]).startswith("/cdn/") and shard in str(e["path"])]
    assert asked == ["bytes=%d-" % (len(data) // 2)], builtin_hub.log
    assert not part.exists()


def test_a_mirror_that_lists_a_path_outside_dest_is_refused(builtin_hub, model, tmp_path, monkeypatch):
    repo = builtin_hub.repos[REPO]
    files = dict(repo.files)
    files["../escape.json"] = dict(files["config.json"])
    monkeypatch.setattr(repo, "files", files)
    failed, res = run({"repo_id": REPO, "dest": str(tmp_path / "dest"), "endpoint": builtin_hub.endpoint,
                       "allow_patterns": ["*.json"]})  # fmt: skip
    assert failed and "'endpoint'" in res["msg"] and "../escape.json" in res["msg"], res
    assert not (tmp_path / "escape.json").exists() and not (tmp_path / "dest").exists()
