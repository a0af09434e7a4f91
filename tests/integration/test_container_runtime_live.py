"""The container runtime of uma.vllm.vllm_service for real: the ``docker run`` line the role
renders, started by the real launcher (plugins/module_utils/node/launch/program.py) as the service unit
would start it, runs the real vLLM CPU engine in a container on this machine's docker.

The lab image stands in for the vLLM image (its venv mounted at /opt/vllm, no GPU: --gpus is
left out); everything else is the role's rendering: host network and IPC, the model mounted
read-only at its own path, the Hugging Face cache volume, the secrets read by the container from
their 0600 file mounted read-only (issue 19 item 6: the role's ``<name>.container.env``, sourced
by the ``/bin/sh`` entrypoint wrapper), ``--rm`` and the container name the unit's ExecStopPost
removes. Run twice, once per container engine the role renders: Docker (``--gpus``) and Podman
(``--device nvidia.com/gpu=...``, CDI; no GPU here, so neither flag is rendered). Podman is
Debian's podman 4.3 on this machine (rootful, overlay, runc); the lab image is copied into its
store (``docker save | podman load``) and removed afterwards. Proven for each: the engine
becomes healthy, the API key from the file guards the API, ``docker/podman inspect`` of the
running container shows no secret value while the engine process in it has the key in its
environment, the engine's ``VLLM::`` processes are found below the container's init (the
dead-rank watch), SIGTERM to the launcher stops the container and leaves none behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import _node_lib  # the installed node programs
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


CLIS = ("docker", "podman")


def _containers(cli, name):
    # docker names carry a leading "/" in the filter; podman's do not
    pattern = ("^/%s$" if cli == "docker" else "^%s$") % name
    out = subprocess.run(
        [cli, "ps", "-a", "--filter", "name=" + pattern, "--format", "{{.Names}} {{.Status}}"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip()


def _cli(name):
    path = shutil.which(name)
    if path is None:
        # tests/setup.sh installs both; a missing one is a broken set-up, not a reason to skip
        pytest.fail("%s is not installed (tests/setup.sh installs docker.io and podman)" % name)
    return path


def _podman_image():
    """The lab image in podman's store (its name there: localhost/<name>); loaded if missing."""
    local = "localhost/" + IMAGE
    if subprocess.run(["podman", "image", "exists", local], check=False).returncode == 0:
        return local, False
    save = subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE)
    subprocess.run(["podman", "load", "-q"], stdin=save.stdout, check=True, capture_output=True, timeout=600)
    save.stdout.close()
    assert save.wait(timeout=60) == 0
    return local, True


def _options(cli):
    options = ["-v", "%s:/opt/vllm:ro" % VENV]
    if cli == "docker":
        options += ["--shm-size", "1g"]  # docker accepts it beside --ipc host; podman refuses it (a role check)
    else:
        # Podman raises RLIMIT_NOFILE/NPROC in the container to its own defaults; this machine's
        # sandbox gives no CAP_SYS_RESOURCE ("error setting rlimit type 7: operation not
        # permitted"), so the lab keeps them at the host's hard limits (a lab-only option, as
        # --ulimit memlock is for Docker in lab/runtime-container.yml); nproc also at most
        # kernel.pid_max (here 32768: runc's setrlimit was refused above it, found by bisection).
        pid_max = int(open("/proc/sys/kernel/pid_max").read())
        for flag, which, cap in (("nofile", resource.RLIMIT_NOFILE, None), ("nproc", resource.RLIMIT_NPROC, pid_max)):
            hard = resource.getrlimit(which)[1]
            if hard != resource.RLIM_INFINITY:
                hard = min(hard, cap or hard)
                options += ["--ulimit", "%s=%d:%d" % (flag, hard, hard)]
    return options


def _as_hf_snapshot(model, hub):
    """The model as the Hugging Face cache lays it out (issue 34 item 3c): each file a blob named by
    its sha256 under models--uma-lab--tiny/blobs, the snapshot a directory of relative symlinks
    (../../blobs/<sha256>), as huggingface_hub's snapshot_download leaves it. Returns the snapshot."""
    repo = hub / "models--uma-lab--tiny"
    snapshot = repo / "snapshots" / ("0123456789abcdef" * 3)[:40]
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(os.listdir(model)):
        data = open(os.path.join(model, path), "rb").read()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", blob), str(snapshot / path))
    shutil.rmtree(model)
    return str(snapshot)


@pytest.fixture(scope="module", params=CLIS)
def launched(tmp_path_factory, request):
    _require()
    cli = request.param
    cli_path = _cli(cli)
    image, loaded = (IMAGE, False) if cli == "docker" else _podman_image()
    work = tmp_path_factory.mktemp("container-live-" + cli)
    model = str(work / "tiny")
    subprocess.run([sys.executable, str(ROOT / "lab" / "make_model.py"), "--out", model], check=True, timeout=300)
    if cli == "podman":
        model = _as_hf_snapshot(model, work / "hf-hub")
    port = _free_port()
    name = "itest-%s-%d" % (cli, os.getpid())
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
        "runtime": "container", "container_engine": cli, "container_bin": cli_path,
        "image": image, "container_gpus": "", "hf_cache": str(work / "hf-cache"),
        "container_options": _options(cli),
        "secrets_dir": str(work / "engines"),
    }  # fmt: skip
    # what roles/vllm_service/tasks/container.yml makes (podman, unlike docker, does not create a
    # missing bind-mount source) and what the role's node_files task writes (0600 root): the
    # container's secrets file
    (work / "hf-cache").mkdir()
    (work / "engines").mkdir()
    secrets_file = work / "engines" / ("%s.container.env" % name)
    fd = os.open(str(secrets_file), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(vs.shell_env({"VLLM_API_KEY": API_KEY}))
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
    env = dict(os.environ, VLLM_API_KEY=API_KEY)  # systemd's EnvironmentFile (the launcher keeps it)
    log = open(work / "launcher.log", "w")
    proc = subprocess.Popen(
        [sys.executable, _node_lib.program("uma_launch.py"), "--engine", name,
         "--config", str(work / "engine.json"), "--node-config", str(work / "none.json")],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 900
    # healthy as the launcher sees it: its engine-healthy step (it then releases the lock)
    while time.monotonic() < deadline and proc.poll() is None and "] engine-healthy " not in _read(work):
        time.sleep(2)
    result = {"proc": proc, "config": config, "name": name, "work": work, "port": port, "cli": cli, "bin": cli_path}
    yield result
    if proc.poll() is None:
        proc.kill()
    subprocess.run([cli, "rm", "-f", vs.container_name(name)], check=False, capture_output=True)
    if loaded:
        subprocess.run(["podman", "rmi", image], check=False, capture_output=True)
    log.close()


def _log(launched):
    return _read(launched["work"])[-3000:]


def test_the_rendered_container_run_serves(launched):
    config = launched["config"]
    assert launched["proc"].poll() is None, _log(launched)
    assert _status(config["health_url"]) == 200, _log(launched)
    container = vs.container_name(launched["name"])
    assert _containers(launched["cli"], container).startswith(container + " Up")
    assert config["command"][:2] == [launched["bin"], "run"]
    if launched["cli"] == "podman":
        # served from a Hugging Face cache snapshot of symlinks: the repository is what is mounted
        repo = os.path.dirname(os.path.dirname(config["model_path"]))
        assert os.path.islink(os.path.join(config["model_path"], "config.json"))
        assert "%s:%s:ro" % (repo, repo) in config["command"], config["command"]
    command = config["command"]
    assert API_KEY not in json.dumps(command) and "VLLM_API_KEY" not in command
    mode = os.stat(launched["work"] / "engines" / ("%s.container.env" % launched["name"])).st_mode & 0o777
    assert mode == 0o600


def test_inspect_shows_no_secret_but_the_engine_has_it(launched):
    """Issue 19 item 6: Config.Env (and everything docker/podman inspect shows) carries no secret value."""
    container = vs.container_name(launched["name"])
    cli = launched["cli"]
    inspect = subprocess.run([cli, "inspect", container], check=True, capture_output=True, text=True).stdout
    assert json.loads(inspect)[0]["State"]["Running"] is True
    assert API_KEY not in inspect
    assert "/run/uma-vllm/secrets.env" in inspect  # the file is mounted (read-only) ...
    mounts = {m["Destination"]: m for m in json.loads(inspect)[0]["Mounts"]}
    assert mounts["/run/uma-vllm/secrets.env"]["RW"] is False
    # ... and the engine process (PID 1 of the container: sh exec'd into it) has the key
    environ = subprocess.run(
        [cli, "exec", container, "cat", "/proc/1/environ"], check=True, capture_output=True
    ).stdout.decode(errors="replace")
    assert "VLLM_API_KEY=%s" % API_KEY in environ.split("\0")
    cmdline = subprocess.run(
        [cli, "exec", container, "cat", "/proc/1/cmdline"], check=True, capture_output=True
    ).stdout.decode(errors="replace")
    assert "vllm.entrypoints.openai.api_server" in cmdline and API_KEY not in cmdline


def test_the_engines_vllm_processes_are_found_inside_the_container(launched):
    """The dead-rank watch (issue 19): the container's processes descend from the container
    runtime, not from the client the launcher started; they are found below the container's init
    (``docker/podman inspect -f {{.State.Pid}}``), for either client."""
    from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import ranks as _ranks

    argv = launched["config"]["command"]
    init = _ranks.container_root_pid(argv)
    assert init is not None and init != launched["proc"].pid
    found = _ranks.vllm_processes(launched["proc"].pid, argv=argv)
    assert found and all(name.startswith("VLLM::") for name in found.values()), found
    assert _ranks.vllm_processes(launched["proc"].pid) == {}  # not below the client itself


def test_the_secret_from_the_environment_guards_the_api(launched):
    url = "http://127.0.0.1:%d/v1/models" % launched["port"]
    assert _status(url) == 401
    assert _status(url, API_KEY) == 200


def test_sigterm_stops_the_container_and_leaves_none(launched):
    proc = launched["proc"]
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    assert code in (0, 143), (code, _log(launched))
    assert "] engine-exited " in _read(launched["work"])  # SIGTERM passed through the client to vLLM
    container = vs.container_name(launched["name"])
    deadline = time.monotonic() + 30
    while _containers(launched["cli"], container) and time.monotonic() < deadline:
        time.sleep(1)
    assert _containers(launched["cli"], container) == ""
    record = json.loads(
        (launched["work"] / "state" / "launches" / launched["name"] / "latest" / "launch.json").read_text()
    )
    assert record["healthy_at"] is not None and record["argv"][:3] == [launched["bin"], "run", "--rm"]
    # vLLM's shared-memory segments: the engine runs with --ipc host, so its message queues (psm_*)
    # live in this machine's /dev/shm, and vLLM 0.32 leaves them there after a SIGTERM; the launcher
    # found them in the container's processes' maps and removed them once the container was gone
    tracked = record.get("shm_tracked") or []
    assert tracked and all(name.startswith(("psm_", "sem.mp-")) for name in tracked), record.get("shm_tracked")
    left = [name for name in tracked if os.path.exists(os.path.join("/dev/shm", name))]
    assert left == [], (left, _log(launched))
