# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 21 item 3: a multi-node engine's model downloaded ONCE (rank 0, the REAL huggingface_hub
client against lab/hub_standin.py, a STAND-IN FOR THE HUB) and copied to the other rank over the
cluster link (uma.vllm.model_copy), through the role's own tasks (models.yml, models_copy.yml).

Two inventory hosts on this machine (connection local, each its own models and config dir, both
cluster addresses 127.0.0.1): ai2's Hub endpoint is a closed port, so ai2 can only get the model
from ai1. With vllm_service_model_source: hub (every node downloads, the behaviour before) the same
inventory fails on ai2; with rank0 (the default) ai2 ends with ai1's verified files, the stand-in
served every file once, a re-run copies nothing, check mode writes nothing, and a rank with another
link key is refused (401) and named. The same in two lab containers: test_model_copy_containers_live.py.
"""

from __future__ import annotations

import json
import socket

import test_vllm_service_hub_live as base
from test_vllm_service_hub_live import REPO, fetch_play, role_play, run

# the Hub test's fixtures (the stand-in Hub over a tiny model, the venv with vLLM's metadata)
model, source, hub, venv = base.model, base.source, base.hub, base.venv

DEAD = "http://127.0.0.1:9"


def _port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def inventory(endpoint):
    return ("[all]\nai1 ansible_connection=local endpoint=%s uma_cluster_addr=127.0.0.1\n"
            "ai2 ansible_connection=local endpoint=%s uma_cluster_addr=127.0.0.1\n" % (endpoint, DEAD))  # fmt: skip


def play(tmp_path, master_port, **kw):
    return fetch_play(tmp_path, engine_extra=", master_port: %d" % master_port, **kw)


def resolves(hub):
    return [e for e in hub.log if "/resolve/" in str(e["path"]) and e["method"] == "GET"]


def task(out, name):
    return out.split("TASK [uma.vllm.vllm_service : %s" % name)[1].split("TASK [")[0]


def test_rank0_downloads_once_and_the_other_rank_copies_it(tmp_path, hub, source):
    master = _port()
    # before: every node asks its Hub endpoint itself, and ai2 has none it can reach
    before = tmp_path / "before"
    before.mkdir()
    proc, out = run(before, play(before, master, source="hub"), inventory(hub.endpoint))
    assert proc.returncode == 2 and "option 'endpoint' = '%s'" % DEAD in out, out[-3000:]

    # check mode on a fresh ai2: nothing written there, no copy server started
    proc, out = run(tmp_path, play(tmp_path, master, source="rank0"), inventory(hub.endpoint), "--check")
    assert proc.returncode == 0, out[-4000:]
    assert not (tmp_path / "ai2" / "models").exists()

    hub.log.clear()
    proc, out = run(tmp_path, play(tmp_path, master, source="rank0"), inventory(hub.endpoint), "-v",
                    "-e", "__vllm_service_copy_idle_s=20")  # fmt: skip
    assert proc.returncode == 0, out[-5000:]
    commit = hub.repos[REPO].commit
    a, b = (tmp_path / h / "models" / "lab" / "tiny-llama" for h in ("ai1", "ai2"))
    names = sorted(json.loads((a / ".uma-model-manifest.json").read_text())["files"])
    assert names and any(n.endswith(".safetensors") for n in names)
    for name in names:
        assert (b / name).read_bytes() == (a / name).read_bytes() == (source / name).read_bytes()
    manifest = json.loads((b / ".uma-model-manifest.json").read_text())
    assert manifest["commit"] == commit and manifest["endpoint"].startswith("copy from engine tp, rank 0 on ai1")
    assert manifest["files"] == json.loads((a / ".uma-model-manifest.json").read_text())["files"]
    # the stand-in served each file once: to ai1
    assert sorted(e["path"].rsplit("/", 1)[1] for e in resolves(hub)) == sorted(n.rsplit("/", 1)[-1] for n in names)
    assert "changed: [ai2]" in task(out, "Copy each model from rank 0")
    served = task(out, "Show what rank 0's copy servers served")
    assert "1 rank(s) done, 0 failed; 0 request(s) refused; stopped (peers done)" in served, served
    assert "served %d file(s)" % len(names) in served
    # both ranks carry the commit, so the rank check compared them
    assert "%s / tp: %s main = commit %s" % ("ai2", REPO, commit) in out
    assert "TASK [uma.vllm.vllm_service : Check that every rank of a multi-node engine has the same commit" in out
    key = tmp_path / "ai2" / "etc" / "engines" / "tp.link.key"
    assert key.stat().st_mode & 0o777 == 0o600

    # again: ai2 has it; nothing copied, no server started, nothing asked of the Hub but the listing
    hub.log.clear()
    proc, out = run(tmp_path, play(tmp_path, master, source="rank0"), inventory(hub.endpoint))
    assert proc.returncode == 0, out[-4000:]
    assert resolves(hub) == []
    role = out.split("TASK [uma.vllm.vllm_service : ")[1:]
    role[-1] = role[-1].split("TASK [Keep what the role now plans with")[0]
    assert "ok: [ai2]" in task(out, "Compare each copying rank's model") and "changed:" not in " ".join(role)
    assert "skipping: [ai1]" in task(out, "Serve rank 0's verified snapshot")

    # a shard damaged on ai2 (same size): verify finds it, names it, and the fix copies it again
    shard = b / next(n for n in names if n.endswith(".safetensors"))
    shard.write_bytes(b"\0" * shard.stat().st_size)
    proc, out = run(tmp_path, play(tmp_path, master, source="rank0"), inventory(hub.endpoint))
    assert proc.returncode == 2 and "%s has sha256" % shard in out and "the file is damaged" in out, out[-3000:]
    shard.unlink()
    proc, out = run(tmp_path, play(tmp_path, master, source="rank0"), inventory(hub.endpoint),
                    "-e", "__vllm_service_copy_idle_s=20")  # fmt: skip
    assert proc.returncode == 0, out[-4000:]
    assert shard.read_bytes() == (a / shard.name).read_bytes()
    assert resolves(hub) == []


def test_a_rank_with_another_link_key_is_refused(tmp_path, hub):
    master = _port()
    # each host its own key directory on the controller: ai2's key differs from ai1's
    proc, out = run(tmp_path, play(tmp_path, master, source="rank0", key_dir_suffix="-{{ inventory_hostname }}"),
                    inventory(hub.endpoint), "-e", "__vllm_service_copy_idle_s=15")  # fmt: skip
    assert proc.returncode == 2, out[-4000:]
    assert "engine tp, rank 0 on ai1 refused the request" in out and "(401)" in out, out[-4000:]
    assert "this node's link key differs from rank 0's" in out
    served = task(out, "Show what rank 0's copy servers served")
    assert "served 0 file(s), 0 bytes; 0 rank(s) done" in served and "stopped (idle)" in served, served
    assert "wrong MAC" in served
    assert not (tmp_path / "ai2" / "models" / "lab" / "tiny-llama" / ".uma-model-manifest.json").exists()


def test_a_bad_source_value_is_refused_before_anything_changes(tmp_path, hub, venv):
    proc, out = run(tmp_path, role_play(tmp_path, hub, venv, REPO), "localhost ansible_connection=local\n",
                    "-e", "vllm_service_model_source=nearest")  # fmt: skip
    assert proc.returncode == 2, out[-3000:]
    assert "vllm_service_model_source" in out and "nearest" in out and "rank0, hub" in out, out[-3000:]
    assert not hub.log
    assert not any((tmp_path / d).exists() for d in ("models", "state", "etc", "systemd"))
