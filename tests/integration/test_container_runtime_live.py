"""The container runtime of uma.vllm.vllm_service for real: the ``docker run`` line the role
renders, started by the real launcher (plugins/module_utils/uma_launch.py) as the service unit
would start it, runs the real vLLM CPU engine in a container on this machine's docker.

The lab image stands in for the vLLM image (its venv mounted at /opt/vllm, no GPU: --gpus is
left out); everything else is the role's rendering: host network and IPC, the model mounted
read-only at its own path, the Hugging Face cache volume, secrets passed by name (``-e NAME``)
from the launcher's environment (what systemd's EnvironmentFile provides), ``--rm`` and the
container name the unit's ExecStopPost removes. Proven: the engine becomes healthy, the API
key from the environment guards the API, SIGTERM to the launcher stops the container and
leaves none behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from test_multinode_argv import engine_command
from test_vllm_parser_oracle import IMAGE, ROOT, VENV, _require, plan_mod

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs

API_KEY = "itest-key-%d" % os.getpid()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url, key=None):
    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + key} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return None


def _read(work):
    return (work / "launcher.log").read_text(errors="replace")


def _containers(name):
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", "name=^/%s$" % name, "--format", "{{.Names}} {{.Status}}"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    _require()
    work = tmp_path_factory.mktemp("container-live")
    model = str(work / "tiny")
    subprocess.run([sys.executable, str(ROOT / "lab" / "make_model.py"), "--out", model], check=True, timeout=300)
    port = _free_port()
    name = "itest-%d" % os.getpid()
    (engine,) = vs.host_engines(
        [
            {
                "name": name, "port": port, "model_path": model, "host": "127.0.0.1",
                "command": ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
                "model_flag": "--model",
                "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "secrets": {"VLLM_API_KEY": API_KEY},
                "plan": {"max_model_len": 512, "max_num_seqs": 4, "extra_args": ["--enforce-eager"]},
            }
        ],
        "lab", "mp",
    )  # fmt: skip
    settings = {
        "runtime": "container", "container_engine": "docker", "container_bin": shutil.which("docker"),
        "image": IMAGE, "container_gpus": "", "hf_cache": str(work / "hf-cache"),
        "container_options": ["--shm-size", "1g", "-v", "%s:/opt/vllm:ro" % VENV],
    }  # fmt: skip
    plan = plan_mod.plan(
        {"model_path": model, "total_memory_gib": 23.0, "reserve_gib": 4.0, "env": engine["env"], **engine["plan"]}
    )
    config = vs.launch_config(engine, plan, settings, {})
    # what roles/launch_wrapper/tasks/engine.yml writes, plus a private lock and state dir
    launcher_config = {
        "engine": name, "command": engine_command(config), "model_path": model, "health_url": config["health_url"],
        "env": config["env"], "plan": config["plan"], "lock_path": str(work / "launch.lock"),
        "state_dir": str(work / "state"), "python": sys.executable, "health_timeout_s": 900,
    }  # fmt: skip
    (work / "engine.json").write_text(json.dumps(launcher_config))
    env = dict(os.environ, VLLM_API_KEY=API_KEY)  # systemd's EnvironmentFile
    log = open(work / "launcher.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "plugins" / "module_utils" / "uma_launch.py"), "--engine", name,
         "--config", str(work / "engine.json"), "--node-config", str(work / "none.json")],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 900
    # healthy as the launcher sees it: its engine-healthy step (it then releases the lock)
    while time.monotonic() < deadline and proc.poll() is None and "] engine-healthy " not in _read(work):
        time.sleep(2)
    result = {"proc": proc, "config": config, "name": name, "work": work, "port": port}
    yield result
    if proc.poll() is None:
        proc.kill()
    subprocess.run(["docker", "rm", "-f", vs.container_name(name)], check=False, capture_output=True)
    log.close()


def _log(launched):
    return _read(launched["work"])[-3000:]


def test_the_rendered_docker_run_serves(launched):
    config = launched["config"]
    assert launched["proc"].poll() is None, _log(launched)
    assert _status(config["health_url"]) == 200, _log(launched)
    assert _containers(vs.container_name(launched["name"])).startswith(vs.container_name(launched["name"]) + " Up")
    command = config["command"]
    assert API_KEY not in json.dumps(command) and command[command.index("VLLM_API_KEY") - 1] == "-e"


def test_the_secret_from_the_environment_guards_the_api(launched):
    url = "http://127.0.0.1:%d/v1/models" % launched["port"]
    assert _status(url) == 401
    assert _status(url, API_KEY) == 200


def test_sigterm_stops_the_container_and_leaves_none(launched):
    proc = launched["proc"]
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    assert code in (0, 143), (code, _log(launched))
    assert "] engine-exited " in _read(launched["work"])  # SIGTERM passed through docker to vLLM
    deadline = time.monotonic() + 30
    while _containers(vs.container_name(launched["name"])) and time.monotonic() < deadline:
        time.sleep(1)
    assert _containers(vs.container_name(launched["name"])) == ""
    record = json.loads(
        (launched["work"] / "state" / "launches" / launched["name"] / "latest" / "launch.json").read_text()
    )
    assert record["healthy_at"] is not None and record["argv"][:3] == [shutil.which("docker"), "run", "--rm"]
