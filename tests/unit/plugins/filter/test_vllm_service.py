"""The filters behind roles/vllm_service: engine selection, checks, command lines, restarts."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from vllm_service_cases import ADDRS, HOSTS, MODEL, NATIVE, engine, one, plan

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs
from ansible_collections.uma.vllm.plugins.module_utils.service import files as vsf
from ansible_collections.uma.vllm.plugins.module_utils.service import state as vss

DOCKER = dict(
    NATIVE,
    runtime="container",
    container_engine="docker",
    container_bin="/usr/bin/docker",
    image="nvcr.io/nvidia/vllm:26.02-py3",
    container_command=None,
    container_gpus="all",
    container_options=["--ulimit", "memlock=-1"],
    hf_cache="/root/.cache/huggingface",
    vllm_cache="/root/.cache/vllm",
)


# --------------------------------------------------------------------------- selection


def test_host_engines_selects_by_nodes_and_numbers_ranks():
    engines = [
        engine(name="solo"),
        engine(name="tp", nodes=["ai1", "ai2"], port=8100),
        engine(name="far", nodes=["ai2", "ai3"]),
    ]
    on_ai1 = vs.host_engines(engines, "ai1", "mp")
    on_ai2 = vs.host_engines(engines, "ai2", "ray")
    assert [e["name"] for e in on_ai1] == ["solo", "tp"]
    assert [e["name"] for e in on_ai2] == ["solo", "tp", "far"]
    assert on_ai1[0]["cluster"] is None and on_ai1[0]["api_rank"] is True
    assert on_ai1[1]["cluster"] == {
        "nodes": ["ai1", "ai2"],
        "nnodes": 2,
        "rank": 0,
        "head": "ai1",
        "backend": "mp",
        "master_port": 29501,
        "ray_port": 6379,
        "link_port": 29511,
    }
    assert on_ai2[1]["cluster"]["rank"] == 1 and on_ai2[1]["api_rank"] is False
    assert on_ai2[1]["cluster"]["backend"] == "ray"  # the role's default backend
    assert on_ai2[2]["cluster"]["head"] == "ai2" and on_ai2[2]["api_rank"] is True


def test_host_engines_keeps_only_secret_names():
    e = one("ai1", secrets={"HF_TOKEN": "hf_SECRET", "VLLM_API_KEY": "", "X": None}, port="8000")
    assert "secrets" not in e
    assert e["secret_names"] == ["HF_TOKEN"] and sorted(e["secret_keys"]) == ["HF_TOKEN", "VLLM_API_KEY", "X"]
    assert "hf_SECRET" not in json.dumps(e)
    assert e["port"] == 8000 and e["state"] == "started"


def test_secrets_filter_returns_this_hosts_non_empty_values():
    engines = [
        engine(name="m", nodes=["ai3", "ai2"], secrets={"HF_TOKEN": "other"}),
        engine(name="m", nodes=["ai1", "ai2"], secrets={"HF_TOKEN": "mine", "EMPTY": ""}),
    ]
    assert vs.secrets(engines, "m", "ai1") == {"HF_TOKEN": "mine"}
    assert vs.secrets(engines, "m", "ai3") == {"HF_TOKEN": "other"}
    assert vs.secrets(engines, "nope", "ai1") == {}


def test_host_engines_refuses_a_non_list():
    with pytest.raises(Exception, match="is not a list"):
        vs.host_engines({"name": "x"}, "ai1")


# --------------------------------------------------------------------------- checks

CHECKS = [
    ("good single", [engine()], NATIVE, None),
    ("good multi", [engine(nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2})], NATIVE, None),
    ("bad name", [engine(name="../x")], NATIVE, "is not a valid engine name"),
    ("twice", [engine(), engine(port=8001)], NATIVE, "is defined twice"),
    ("same port", [engine(name="a"), engine(name="b")], NATIVE, "is already the port of engine a"),
    ("port range", [engine(port=70000)], NATIVE, "is not a TCP port"),
    ("relative model", [engine(model_path="models/x")], NATIVE, "is not an absolute path"),
    ("env name", [engine(env={"BAD-NAME": "1"})], NATIVE, "is not an environment variable name"),
    ("secret name", [engine(secrets={"1X": "v"})], NATIVE, "is not an environment variable name"),
    ("overlap", [engine(env={"HF_TOKEN": "a"}, secrets={"HF_TOKEN": "b"})], NATIVE, "are also in env"),
    ("no image", [engine()], dict(DOCKER, image=""), "is empty while the runtime is container"),
    (
        "a bad digest",
        [engine()],
        dict(DOCKER, image="reg.test/vllm@sha256:abc"),
        'vllm_service_image = "reg.test/vllm@sha256:abc" is not NAME@sha256:',
    ),
    (
        "a blank in an engine's image",
        [engine(image="x:1 --privileged")],
        DOCKER,
        'vllm_service_engines[e].image = "x:1 --privileged" has a blank',
    ),
    (
        "podman shm-size",
        [engine()],
        dict(DOCKER, container_engine="podman", container_options=["--shm-size=1g"]),
        "sets --shm-size, which podman refuses with --ipc host",
    ),
    ("docker shm-size", [engine()], dict(DOCKER, container_options=["--shm-size", "1g"]), None),
    ("bad command", [engine(command="vllm serve")], NATIVE, "is not a list of words"),
    ("one node", [engine(nodes=["ai1"])], NATIVE, "must list at least two hosts"),
    (
        "unknown node",
        [engine(nodes=["ai1", "nowhere"], plan={"tensor_parallel_size": 2})],
        NATIVE,
        "are not hosts of this inventory",
    ),
    ("dup node", [engine(nodes=["ai1", "ai1"], plan={"tensor_parallel_size": 2})], NATIVE, "lists a host twice"),
    ("tp 1 over 2", [engine(nodes=["ai1", "ai2"])], NATIVE, "does not spread over 2 nodes"),
    ("tp 3 over 2", [engine(nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 3})], NATIVE, "does not spread"),
    (
        "backend in plan",
        [engine(nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2, "distributed_executor_backend": "ray"})],
        NATIVE,
        "is set by the role for multi-node engines",
    ),
    ("absent skips", [engine(name="a"), engine(name="b", state="absent", port=0)], NATIVE, None),
    (
        "link port range",
        [engine(nodes=["ai1", "ai2"], link_port=0, plan={"tensor_parallel_size": 2})],
        NATIVE,
        ".link_port = 0 is not a TCP port",
    ),
    (
        "link port = master port",
        [engine(nodes=["ai1", "ai2"], master_port=29501, link_port=29501, plan={"tensor_parallel_size": 2})],
        NATIVE,
        ".link_port = 29501 is also the engine's master_port",
    ),
    (
        "master port = API port",
        [engine(nodes=["ai1", "ai2"], master_port=8000, plan={"tensor_parallel_size": 2})],
        NATIVE,
        ".master_port = 8000 is also the engine's port",
    ),
]


def keyed(e):
    """The engine with an API key (the CHECKS above are about other things than api_auth)."""
    return dict(e, secrets=dict({"VLLM_API_KEY": "k"}, **(e.get("secrets") or {})))


@pytest.mark.parametrize(("case", "engines", "settings", "expect"), CHECKS, ids=[c[0] for c in CHECKS])
def test_check(case, engines, settings, expect):
    engines = [keyed(e) for e in engines]
    normalized = []
    for e in engines:
        normalized += vs.host_engines([e], "ai1", "mp") if "ai1" in (e.get("nodes") or ["ai1"]) else []
    errors = vs.check(normalized, settings, HOSTS, ADDRS)
    if expect is None:
        assert errors == []
    else:
        assert len(errors) == 1 and expect in errors[0], errors
        assert " Fix: " in errors[0]  # every refusal says how to fix it


def test_check_needs_the_head_address():
    (e,) = vs.host_engines([keyed(engine(nodes=["ai2", "ai1"], plan={"tensor_parallel_size": 2}))], "ai1", "mp")
    (err,) = vs.check([e], NATIVE, HOSTS, {"ai2": None})
    assert "uma_cluster_addr" in err and "host_vars/ai2.yml" in err


# --------------------------------------------------------------------------- command lines


def test_planned_args_and_its_refusal():
    assert vs.planned_args(["vllm", "serve", "m", "--a", "1"]) == ["--a", "1"]
    with pytest.raises(Exception, match="not \\[vllm, serve"):
        vs.planned_args(["python", "-m", "x"])


def test_ray_args_drop_every_mp_multinode_flag():
    args = [
        "--tensor-parallel-size",
        "2",
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "2",
        "--node-rank=1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29501",
        "--headless",
        "--enforce-eager",
    ]
    assert vs.ray_args(args) == [
        "--tensor-parallel-size",
        "2",
        "--enforce-eager",
        "--distributed-executor-backend",
        "ray",
    ]


def test_native_single_node():
    config = vs.launch_config(
        one("ai1", env={"A": "1"}, secrets={"K": "s3cret"}), plan(["--x", "1"], env={"A": "1"}), NATIVE, {}
    )
    assert config["command"] == NATIVE["native_command"] and config["model_flag"] == "--model"
    assert config["args"] == ["--x", "1"] and config["env"] == {"A": "1"}
    assert config["health_url"] == "http://127.0.0.1:8000/health" and config["host"] == "0.0.0.0"
    assert "s3cret" not in json.dumps(config)


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("10.1.1.1", "http://10.1.1.1:8000/health"),
        ("::", "http://127.0.0.1:8000/health"),
        ("fd00::1", "http://[fd00::1]:8000/health"),
    ],
)
def test_health_url_follows_the_api_host(host, url):
    assert vs.launch_config(one("ai1", host=host), plan(), NATIVE, {})["health_url"] == url


def test_docker_command_reads_secrets_from_the_mounted_file_not_env():
    """Issue 19 item 6: no `-e SECRET` (docker inspect shows Config.Env); the 0600 file is mounted
    read-only and the /bin/sh entrypoint exports it before it execs the engine."""
    e = one("ai1", env={"VLLM_CPU_KVCACHE_SPACE": "1"}, secrets={"HF_TOKEN": "hf_x", "VLLM_API_KEY": "k"})
    config = vs.launch_config(e, plan(["--x"], env=e["env"]), dict(DOCKER, secrets_dir="/etc/uma-vllm/engines"), {})
    assert config["command"] == [
        "/usr/bin/docker",
        "run",
        "--rm",
        "--name",
        "uma-vllm-e",
        "--network",
        "host",
        "--ipc",
        "host",
        "--gpus",
        "all",
        "-v",
        "/models/tiny:/models/tiny:ro",
        "-v",
        "/root/.cache/huggingface:/root/.cache/huggingface",
        "-v",
        "/root/.cache/vllm:/root/.cache/vllm",
        "-v",
        "/etc/uma-vllm/engines/e.container.env:/run/uma-vllm/secrets.env:ro",
        "-e",
        "VLLM_CPU_KVCACHE_SPACE",
        "--ulimit",
        "memlock=-1",
        "--entrypoint",
        "/bin/sh",
        "nvcr.io/nvidia/vllm:26.02-py3",
        "-c",
        'set -a; . /run/uma-vllm/secrets.env; set +a; exec "$@"',
        "sh",
        "vllm",
        "serve",
    ]
    assert config["model_flag"] == "" and config["args"] == ["--x"]
    assert "hf_x" not in json.dumps(config) and "HF_TOKEN" not in config["command"]


@pytest.mark.parametrize(
    ("model_path", "mount"),
    [
        ("/models/tiny", "/models/tiny"),
        # a Hugging Face cache snapshot: its files link into ../../blobs, so the repository is mounted
        ("/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/" + "a" * 40,
         "/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B"),
        ("/data/hub/models--o--n/snapshots/main/", "/data/hub/models--o--n"),
        ("/data/hub/models--o--n/snapshots/abc/sub/dir", "/data/hub/models--o--n"),
        # not a snapshot layout: the directory itself
        ("/data/models--o--n", "/data/models--o--n"),
        ("/data/snapshots/abc", "/data/snapshots/abc"),
    ],
)  # fmt: skip
def test_the_model_mount_covers_a_hugging_face_snapshot(model_path, mount):
    """Issue 34 item 3c: a model_path inside an HF cache snapshot works in a container."""
    command = vs.launch_config(one("ai1", model_path=model_path), plan(), DOCKER, {})["command"]
    assert command[command.index("-v") + 1] == "%s:%s:ro" % (mount, mount)
    assert "/models/tiny:/models/tiny:ro" not in command or mount == "/models/tiny"


@pytest.mark.parametrize("model_path", ["/models/a:b", "/models/a,b", "/models/a\nb"])
def test_a_model_path_the_mount_would_misread_is_refused(model_path):
    with pytest.raises(Exception, match="model_path") as err:
        vs.launch_config(one("ai1", model_path=model_path), plan(), DOCKER, {})
    assert "cannot be mounted into the container" in str(err.value) and "Fix:" in str(err.value)


@pytest.mark.parametrize(
    ("settings", "engine_kw", "words", "model_flag"),
    [
        # vllm/vllm-openai's entrypoint is `vllm serve`: the wrapper replaces it, so it is explicit
        (dict(DOCKER, image="vllm/vllm-openai:v0.32.0"), {}, ["vllm", "serve"], ""),
        (dict(DOCKER, container_engine="podman", container_bin="/usr/bin/podman"), {}, ["vllm", "serve"], ""),
        (
            DOCKER,
            {"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "model_flag": "--model"},
            ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            "--model",
        ),
    ],
)
def test_secret_wrapper_keeps_the_engine_command(settings, engine_kw, words, model_flag):
    config = vs.launch_config(one("ai1", secrets={"HF_TOKEN": "t"}, **engine_kw), plan(), settings, {})
    command = config["command"]
    image = settings["image"]
    assert command[command.index(image) - 2 : command.index(image)] == ["--entrypoint", "/bin/sh"]
    assert command[command.index(image) + 3 :] == ["sh", *words]
    assert "/etc/uma-vllm/engines/e.container.env:/run/uma-vllm/secrets.env:ro" in command
    assert config["model_flag"] == model_flag
    # the wrapper really runs the engine's words with the launcher's model and args appended
    script = command[command.index(image) + 2]
    out = subprocess.run(
        ["/bin/sh", "-c", script.replace("/run/uma-vllm/secrets.env", "/dev/null"), "sh", "echo", "a b", "c"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout == "a b c\n"


def test_no_secrets_no_wrapper():
    command = vs.launch_config(one("ai1"), plan(), DOCKER, {})["command"]
    assert "--entrypoint" not in command and not any("secrets.env" in w for w in command)


def test_ray_head_with_secrets_sources_them_before_ray():
    e = one("ai1", nodes=["ai1", "ai2"], backend="ray", plan={"tensor_parallel_size": 2}, secrets={"HF_TOKEN": "t"})
    command = vs.launch_config(e, plan(MP_TAIL), DOCKER, ADDRS)["command"]
    script = command[command.index("-c") + 1]
    assert script.startswith("set -a; . /run/uma-vllm/secrets.env; set +a; ray start --head")
    assert command[command.index("-c") + 2 :] == ["vllm", "serve"]


def test_shell_env_is_sourced_literally(tmp_path):
    """The container's secrets file: sh gets each value back byte for byte (no $, `, \\ expansion)."""
    secrets = {"A": "plain", "B": 'it\'s $HOME `id` \\n "q"', "C": "line1\nline2"}
    path = tmp_path / "s.env"
    path.write_text(vs.shell_env(secrets))
    out = subprocess.run(
        ["/bin/sh", "-c", 'set -a; . "$1"; set +a; exec env -0', "sh", str(path)],
        capture_output=True, check=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    env = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    assert {k: env[k] for k in secrets} == secrets
    with pytest.raises(Exception, match="not an environment variable name"):
        vs.shell_env({"BAD-NAME": "x"})


def test_the_vllm_cache_is_mounted_where_vllm_looks_and_can_be_left_out():
    """A restarted engine's new container finds vLLM's cache of the last one (torch.compile
    artifacts, the model registry's inspection: ~10 s of CPU per rank on the lab's CPUs)."""
    e = one("ai1")
    words = vs.launch_config(e, plan([]), DOCKER, {})["command"]
    assert words[words.index("/root/.cache/vllm:/root/.cache/vllm") - 1] == "-v"
    for off in ("", None):
        words = vs.launch_config(e, plan([]), dict(DOCKER, vllm_cache=off), {})["command"]
        assert not any(".cache/vllm" in word for word in words)


@pytest.mark.parametrize("option", ["hf_cache", "vllm_cache"])
@pytest.mark.parametrize("bad", ["cache/vllm", "/srv/a:b", "/srv/a,b", "/srv/a\nb"])
def test_a_cache_directory_docker_would_misread_is_refused_naming_the_option(option, bad):
    with pytest.raises(Exception) as err:
        vs.launch_config(one("ai1"), plan([]), dict(DOCKER, **{option: bad}), {})
    message = str(err.value)
    assert "vllm_service_" + option in message and "Give a directory on the node" in message


def test_container_engine_command_may_take_the_model_by_flag():
    e = one("ai1", command=["python3", "-m", "vllm.entrypoints.openai.api_server"], model_flag="--model")
    config = vs.launch_config(e, plan(), DOCKER, {})
    assert config["model_flag"] == "--model" and config["command"][-3:] == e["command"]
    assert vs.launch_config(one("ai1"), plan(), DOCKER, {})["model_flag"] == ""


@pytest.mark.parametrize(
    ("settings", "engine_kw", "gpu", "tail"),
    [
        (dict(DOCKER, image="vllm/vllm-openai:v0.32.0"), {}, ["--gpus", "all"], []),
        (
            dict(DOCKER, container_engine="podman", container_bin="/usr/bin/podman"),
            {},
            ["--device", "nvidia.com/gpu=all"],
            ["vllm", "serve"],
        ),
        (dict(DOCKER, container_gpus=""), {}, [], ["vllm", "serve"]),
        (dict(DOCKER, container_command=["serve"]), {}, ["--gpus", "all"], ["serve"]),
        (
            DOCKER,
            {"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"]},
            ["--gpus", "all"],
            ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        ),
    ],
)
def test_container_variants(settings, engine_kw, gpu, tail):
    command = vs.launch_config(one("ai1", **engine_kw), plan(), settings, {})["command"]
    image = settings["image"]
    assert command[0] == settings["container_bin"]
    assert command[command.index(image) + 1 :] == tail
    if gpu:
        assert command[command.index(gpu[0]) : command.index(gpu[0]) + 2] == gpu
    else:
        assert "--gpus" not in command and "--device" not in command


MP_TAIL = [
    "--tensor-parallel-size",
    "2",
    "--distributed-executor-backend",
    "mp",
    "--nnodes",
    "2",
    "--node-rank",
    "1",
    "--master-addr",
    "10.0.0.1",
    "--master-port",
    "29501",
    "--headless",
]


def test_mp_worker_keeps_planned_flags_and_waits_for_rank0():
    e = one("ai2", nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2})
    config = vs.launch_config(e, plan(MP_TAIL), DOCKER, ADDRS)
    assert config["args"] == MP_TAIL
    assert config["health_url"] == "http://10.0.0.1:8000/health"
    assert config["env"] == {
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "UCX_NET_DEVICES": "enp1s0f1np1",
        "OMPI_MCA_btl_tcp_if_include": "enp1s0f1np1",
        "VLLM_HOST_IP": "10.0.0.2",
        "MASTER_ADDR": "10.0.0.1",
    }
    for name in config["env"]:
        assert config["command"][config["command"].index(name) - 1] == "-e"


def test_every_rank_gets_the_rank_link_and_only_mp_ranks_compare_configurations():
    for host, rank in (("ai1", 0), ("ai2", 1)):
        e = one(host, nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2})
        config = vs.launch_config(e, plan(MP_TAIL), dict(NATIVE, peer_timeout_s=300, secrets_dir="/etc/x/engines"),
                                  ADDRS)  # fmt: skip
        # the link is signed with the engine's key (issue 19 item 7); rank 0 listens on its cluster address
        assert config["cluster"] == dict({
            "rank": rank, "nnodes": 2, "head_addr": "10.0.0.1", "link_port": 29511, "peer_timeout_s": 300.0,
            "compare": True, "key_file": "/etc/x/engines/%s.link.key" % e["name"],
        }, **({"bind_addr": "10.0.0.1"} if rank == 0 else {}))  # fmt: skip
    e = one("ai2", nodes=["ai1", "ai2"], backend="ray", link_port=7000, plan={"tensor_parallel_size": 2})
    config = vs.launch_config(e, plan(MP_TAIL), NATIVE, ADDRS)
    assert config["cluster"]["link_port"] == 7000 and config["cluster"]["compare"] is False
    assert config["cluster"]["peer_timeout_s"] == 600.0  # the role's default when the setting is absent
    assert "cluster" not in vs.launch_config(one("ai1"), plan(), NATIVE, ADDRS)


def _fake_ray(tmp_path):
    log = tmp_path / "ray.json"
    ray = tmp_path / "ray"
    ray.write_text(
        "#!%s\nimport json, sys\nopen(%r, 'w').write(json.dumps(sys.argv[1:]))\n" % (sys.executable, str(log))
    )
    ray.chmod(ray.stat().st_mode | stat.S_IEXEC)
    dump = tmp_path / "engine.py"
    dump.write_text("import json, sys\nopen(%r, 'w').write(json.dumps(sys.argv[1:]))\n" % str(tmp_path / "engine.json"))
    return ray, log, dump


def _compose(config):
    # as roles/launch_wrapper/tasks/engine.yml: command + model + --host/--port + args
    model = [config["model_path"]] if config["model_flag"] == "" else [config["model_flag"], config["model_path"]]
    return [*config["command"], *model, "--host", config["host"], "--port", str(config["port"]), *config["args"]]


def test_ray_head_script_starts_ray_then_execs_the_engine_with_every_word_intact(tmp_path):
    ray, log, dump = _fake_ray(tmp_path)
    settings = dict(
        NATIVE, ray_command=[str(ray)], native_command=[sys.executable, str(dump)], native_model_flag="--model"
    )
    e = one("ai1", nodes=["ai1", "ai2"], backend="ray", plan={"tensor_parallel_size": 2})
    tricky = ["--override-generation-config", '{"temperature": 0.5, "note": "it\'s $HOME"}']
    config = vs.launch_config(e, plan([*MP_TAIL[:-3], *tricky]), settings, ADDRS)
    assert config["command"][:2] == ["/bin/sh", "-c"]
    run = subprocess.run(
        _compose(config), check=False, capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(log.read_text()) == ["start", "--head", "--port=6379", "--node-ip-address=10.0.0.2"]
    assert json.loads((tmp_path / "engine.json").read_text()) == [
        "--model",
        MODEL,
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "2",
        *tricky,
        "--distributed-executor-backend",
        "ray",
    ]
    assert config["env"]["RAY_memory_monitor_refresh_ms"] == "0"


def test_ray_worker_only_joins_the_cluster(tmp_path):
    ray, log, _dump = _fake_ray(tmp_path)
    settings = dict(NATIVE, ray_command=[str(ray)])
    e = one("ai2", nodes=["ai1", "ai2"], backend="ray", plan={"tensor_parallel_size": 2})
    config = vs.launch_config(e, plan(MP_TAIL), settings, ADDRS)
    assert config["args"] == [] and config["health_url"] == "http://10.0.0.1:8000/health"
    run = subprocess.run(_compose(config), check=False, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(log.read_text()) == ["start", "--block", "--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2"]


def test_ray_in_a_container_uses_the_recipes_entrypoint():
    e = one("ai1", nodes=["ai1", "ai2"], backend="ray", plan={"tensor_parallel_size": 2})
    command = vs.launch_config(e, plan(MP_TAIL[:-3]), DOCKER, ADDRS)["command"]
    image = DOCKER["image"]
    assert command[command.index(image) - 2 : command.index(image)] == ["--entrypoint", "/bin/sh"]
    assert command[command.index(image) + 1] == "-c" and command[-2:] == ["vllm", "serve"]


# --------------------------------------------------------------------------- systemd side


def test_drop_in_for_each_runtime():
    assert vs.drop_in(one("ai1"), NATIVE) == {
        "role": "single node",
        "runtime": "native",
        "after": [],
        "requires": [],
        "wants": [],
        "cleanup": None,
    }
    d = vs.drop_in(one("ai2", nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2}), DOCKER)
    assert d["role"] == "rank 1 of 2, mp, headless" and d["after"] == d["wants"] == ["docker.service"]
    # not Requires=: `systemctl restart docker` would stop the rank as if on purpose (its peers then
    # stay down); molecule/cluster_container's restart-docker drill proves the engine comes back
    assert d["requires"] == []
    assert d["cleanup"] == "/usr/bin/docker rm -f uma-vllm-e" and d["image"] == DOCKER["image"]
    assert "image_id" not in d  # the image is not on the node (check mode before a pull)
    pinned = vs.drop_in(one("ai1"), dict(DOCKER, image_ids={DOCKER["image"]: "sha256:" + "e" * 64}))
    assert pinned["image_id"] == "sha256:" + "e" * 64  # a tag pulled onto another Id rewrites the drop-in
    podman = vs.drop_in(one("ai1"), dict(DOCKER, container_engine="podman", container_bin="/usr/bin/podman"))
    assert podman["after"] == [] and podman["cleanup"] == "/usr/bin/podman rm -f uma-vllm-e"


def test_images_each_once_for_container_engines_only():
    engines = [
        one("ai1", name="a"),
        one("ai1", name="b", runtime="native"),
        one("ai1", name="c", image="x:1"),
        one("ai1", name="d"),
    ]
    assert vs.images(engines, DOCKER) == [DOCKER["image"], "x:1"]
    assert vs.images(engines, NATIVE) == []


PATHS = {
    "systemd_dir": "/etc/systemd/system",
    "config_dir": "/etc/uma-vllm",
    "engines_dir": "/etc/uma-vllm/engines",
    "state_dir": "/var/lib/uma-vllm",
    "watchdog_dir": "/etc/uma-vllm/watchdog",
    "unit": "uma-vllm@.service",
    "watchdog_unit": "uma-vllm-watchdog@.service",
    "unit_content": "[Unit]\n",
    "watchdog_unit_content": "[Unit]\nwatchdog\n",
}


def _written(unit=(False, "u"), wd_unit=None, **engines):
    """A node_files result: per engine (drop-in, env, config, watchdog) (changed, checksum) pairs."""
    files = {"/etc/systemd/system/uma-vllm@.service": {"changed": unit[0], "checksum": unit[1]}}
    if wd_unit:
        files["/etc/systemd/system/uma-vllm-watchdog@.service"] = {"changed": wd_unit[0], "checksum": wd_unit[1]}
    for name, parts in engines.items():
        where = vsf.engine_paths(PATHS, name)
        for key, (changed, checksum) in zip(("drop_in", "env", "config", "watchdog"), parts):
            files[where[key]] = {"changed": changed, "checksum": checksum}
    return {"files": files}


def test_files_state_and_changed():
    engines = [one("ai1", name="a"), one("ai1", name="b", port=1), one("ai1", name="s", port=2, state="stopped")]
    result = _written(
        a=[(False, "da"), (False, "ea"), (True, "j1x")],
        b=[(False, "db"), (True, "eb"), (False, "j2")],
        s=[(False, "ds"), (True, "es"), (False, "j3")],
    )
    state = vs.files_state(engines, result, PATHS)
    assert state["written"] == ["a", "b", "s"] and state["unit_changed"] is False and state["reload"] is False
    # the same text the role wrote before node_files (unit/drop-in/env/config sha1s)
    assert state["fingerprints"]["a"] == "u/da/ea/j1x"
    stamps = dict(state["fingerprints"])
    assert vs.changed(engines, state["written"], False, state["fingerprints"], stamps) == [
        "a",
        "b",
    ]  # never stopped ones
    assert vs.changed(engines, [], False, state["fingerprints"], stamps) == []
    assert vs.changed(engines, [], True, state["fingerprints"], stamps) == ["a", "b"]  # the shared unit
    assert vs.changed(engines, [], False, state["fingerprints"], dict(stamps, b="old")) == [
        "b"
    ]  # failed run / 1st start


def test_files_state_reload_and_watchdogs():
    quiet = [(False, "d"), (False, "e"), (False, "j"), (False, "w")]
    engines = [one("ai1", name="a"), one("ai1", name="b", port=1)]
    state = vs.files_state(engines, _written(wd_unit=(False, "x"), a=quiet, b=quiet), PATHS)
    assert state["reload"] is False and state["watchdogs_changed"] == [] and state["written"] == []
    drop_in = [(True, "d2"), *quiet[1:]]
    state = vs.files_state(engines, _written(wd_unit=(False, "x"), a=drop_in, b=[*quiet[:3], (True, "w2")]), PATHS)
    assert state["reload"] is True and state["unit_changed"] is False
    assert state["written"] == ["a"] and state["watchdogs_changed"] == ["b"]  # a watchdog config is not the engine's
    state = vs.files_state(engines, _written(wd_unit=(True, "x2"), a=quiet, b=quiet), PATHS)
    assert state["reload"] is True and state["watchdogs_changed"] == ["a", "b"] and state["written"] == []
    state = vs.files_state(engines, _written(unit=(True, "u2"), a=quiet, b=quiet), PATHS)
    assert state["unit_changed"] is True and state["reload"] is True


def test_node_files_arranges_every_file():
    renders = [
        {"item": {"name": "a"}, "ansible_facts": {"__vllm_service_rendered": {"drop_in": "D-a", "env": "SECRET-a"}}},
        {"item": {"name": "b"}, "ansible_facts": {"__vllm_service_rendered": {"drop_in": "D-b", "env": "SECRET-b"}}},
    ]
    launch = [{"path": "/etc/uma-vllm/engines/a.json", "mode": "0644", "content": "{}\n"}]
    out = vs.node_files(renders, launch, [{"name": "a", "config": {"rank": 0, "x": [1]}}], PATHS)
    assert [d["path"] for d in out["directories"]] == [
        "/etc/uma-vllm",  # parents first: a check-mode run on a fresh node has none of them
        "/etc/uma-vllm/engines",
        "/var/lib/uma-vllm",
        "/etc/systemd/system/uma-vllm@a.service.d",
        "/etc/systemd/system/uma-vllm@b.service.d",
        "/etc/uma-vllm/watchdog",
    ]
    paths = {f["path"]: f for f in out["files"]}
    assert paths["/etc/systemd/system/uma-vllm@.service"]["content"] == "[Unit]\n"
    assert paths["/etc/systemd/system/uma-vllm@b.service.d/10-uma-vllm.conf"]["content"] == "D-b"
    assert paths["/etc/uma-vllm/engines/a.json"] == launch[0]
    assert paths["/etc/systemd/system/uma-vllm-watchdog@.service"]["content"] == "[Unit]\nwatchdog\n"
    # to_nice_json(indent=2) and a newline, what the copy task wrote
    assert paths["/etc/uma-vllm/watchdog/a.json"]["content"] == '{\n  "rank": 0,\n  "x": [\n    1\n  ]\n}\n'
    assert all("SECRET" not in f["content"] for f in out["files"])
    assert [(f["path"], f["mode"], f["content"]) for f in out["secret_files"]] == [
        ("/etc/uma-vllm/engines/a.env", "0600", "SECRET-a"),
        ("/etc/uma-vllm/engines/b.env", "0600", "SECRET-b"),
    ]
    none = vs.node_files(renders[:1], [], [], PATHS)  # no watchdogs: neither their dir nor their unit
    assert "/etc/uma-vllm/watchdog" not in [d["path"] for d in none["directories"]]
    assert not [f for f in none["files"] if "watchdog" in f["path"]]


def test_a_container_engines_secrets_file_is_a_0600_secret_file_and_restarts_it():
    """Issue 19 item 6: <name>.container.env goes with the secret files (0600, never shown) and a
    change of it alone restarts the engine."""
    rendered = {"drop_in": "D-c", "env": "SECRET-c", "container_env": "C='SECRET'\n"}
    renders = [
        {"item": {"name": "c"}, "ansible_facts": {"__vllm_service_rendered": rendered}},
        {"item": {"name": "n"}, "ansible_facts": {"__vllm_service_rendered": dict(rendered, container_env="")}},
    ]
    out = vs.node_files(renders, [], [], PATHS)
    assert [(f["path"], f["mode"]) for f in out["secret_files"]] == [
        ("/etc/uma-vllm/engines/c.env", "0600"),
        ("/etc/uma-vllm/engines/c.container.env", "0600"),
        ("/etc/uma-vllm/engines/n.env", "0600"),
    ]
    assert all("SECRET" not in f["content"] for f in out["files"])
    engines = [one("ai1", name="c")]
    result = _written(c=[(False, "d"), (False, "e"), (False, "j")])
    assert vs.files_state(engines, result, PATHS)["written"] == []
    result["files"]["/etc/uma-vllm/engines/c.container.env"] = {"changed": True, "checksum": "x"}
    state = vs.files_state(engines, result, PATHS)
    assert state["written"] == ["c"] and state["fingerprints"]["c"] == "u/d/e/j"  # fingerprint unchanged


def test_with_peers_restarts_every_rank():
    mine = [
        one("ai2", name="tp", nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2}),
        one("ai2", name="solo", port=1),
    ]
    assert vs.with_peers(mine, [], {"ai1": ["tp"], "ai2": []}) == ["tp"]
    assert vs.with_peers(mine, ["solo"], {"ai1": []}) == ["solo"]
    assert vs.peers_changed(mine, {"ai1": {"__vllm_service_local_changed": ["tp"]}, "ai2": {}}) == {
        "ai1": ["tp"],
        "ai2": [],
    }


def test_head_addrs_prefer_what_the_head_found():
    mine = [one("ai2", name="tp", nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2})]
    assert vs.head_addrs(
        mine, {"ai1": {"__vllm_service_node": {"addr": "1.1.1.1"}, "uma_cluster_addr": "2.2.2.2"}}
    ) == {"ai1": "1.1.1.1"}
    assert vs.head_addrs(mine, {"ai1": {"uma_cluster_addr": "2.2.2.2"}}) == {"ai1": "2.2.2.2"}
    assert vs.head_addrs(mine, {}) == {"ai1": None}


def test_unit_states():
    out = (
        "Id=uma-vllm@a.service\nActiveState=active\nUnitFileState=enabled\n\n"
        "Id=uma-vllm@b.service\nActiveState=inactive\nUnitFileState=disabled\n"
    )
    states = vss.unit_states(out, ["a", "b", "c"])
    assert states["a"]["ActiveState"] == "active" and states["b"]["UnitFileState"] == "disabled"
    assert states["c"] == {"ActiveState": "inactive", "UnitFileState": ""}


def test_status_entry():
    e = one("ai1", name="a")
    config = vs.launch_config(e, plan(), NATIVE, {})
    entry = vs.status_entry(config, [e], ["a"], [{"item": {"name": "a"}, "rc": 0}])
    assert entry == {
        "unit": "uma-vllm@a.service",
        "state": "started",
        "role": "single node",
        "health_url": "http://127.0.0.1:8000/health",
        "healthy": True,
        "restarted": True,
        "port": 8000,
    }
    assert vs.status_entry(config, [e], [], [{"item": {"name": "a"}, "skipped": True}])["healthy"] is None


def test_unit_actions_from_the_states_read_before_writing():
    engines = [
        dict(one("ai1", name="up"), api_rank=True),  # running, enabled: nothing
        dict(one("ai1", name="new", port=1), api_rank=True),  # no unit yet: enable and start
        dict(one("ai1", name="rank1", port=2), api_rank=False),  # a worker rank that is down: started after
        dict(one("ai1", name="changed", port=3), api_rank=True),  # down, but the handler restarts it
        dict(one("ai1", name="off", port=4, state="stopped"), api_rank=True),  # enabled and running: both go
        dict(one("ai1", name="off2", port=5, state="stopped"), api_rank=True),  # already stopped and disabled
    ]
    units = {
        "up": {"ActiveState": "active", "UnitFileState": "enabled"},
        "rank1": {"ActiveState": "failed", "UnitFileState": "enabled"},
        "changed": {"ActiveState": "inactive", "UnitFileState": "enabled"},
        "off": {"ActiveState": "activating", "UnitFileState": "enabled"},
        "off2": {"ActiveState": "inactive", "UnitFileState": "disabled"},
    }
    acts = vs.unit_actions(engines, units, ["changed"])
    assert acts == {
        "enable": ["new"],
        "disable": ["off"],
        "start_api": ["new"],
        "start_workers": ["rank1"],
        "reset": ["new", "rank1"],
    }
    assert vs.unit_actions(engines[:1], {}, [])["start_api"] == ["up"]  # not reported: inactive


# --------------------------------------------------------------------------- the link key (issue 19 item 7)


def test_a_multi_node_engines_link_key_is_a_0600_secret_file_and_a_new_key_restarts_it():
    """The key made on the controller goes with the secret files (0600, never in the shown files);
    a rotated key restarts the engine and its watchdog (they read the key when they start)."""
    key = "ab" * 32
    rendered = {"drop_in": "D-tp", "env": "E", "link_key": key}
    renders = [
        {"item": {"name": "tp"}, "ansible_facts": {"__vllm_service_rendered": rendered}},
        {"item": {"name": "solo"}, "ansible_facts": {"__vllm_service_rendered": dict(rendered, link_key="")}},
    ]
    out = vs.node_files(renders, [], [], PATHS)
    assert [(f["path"], f["mode"]) for f in out["secret_files"]] == [
        ("/etc/uma-vllm/engines/tp.env", "0600"),
        ("/etc/uma-vllm/engines/tp.link.key", "0600"),
        ("/etc/uma-vllm/engines/solo.env", "0600"),
    ]
    assert out["secret_files"][1]["content"] == key + "\n"
    assert all(key not in f["content"] for f in out["files"])
    engines = [one("ai1", name="tp", nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2})]
    result = _written(tp=[(False, "d"), (False, "e"), (False, "j"), (False, "w")])
    assert vs.files_state(engines, result, PATHS)["written"] == []
    result["files"]["/etc/uma-vllm/engines/tp.link.key"] = {"changed": True, "checksum": "k2"}
    state = vs.files_state(engines, result, PATHS)
    assert state["written"] == ["tp"] and state["watchdogs_changed"] == ["tp"]


@pytest.mark.parametrize("value", ["relative/keys", "", None, "/with space/keys", "/a\nb"])
def test_a_bad_link_key_dir_is_refused_for_multi_node_engines_only(value):
    (tp,) = vs.host_engines([keyed(engine(nodes=["ai1", "ai2"], plan={"tensor_parallel_size": 2}))], "ai1", "mp")
    (solo,) = vs.host_engines([keyed(engine(name="solo"))], "ai1", "mp")
    (err,) = vs.check([tp], dict(NATIVE, link_key_dir=value), HOSTS, ADDRS)
    assert err.startswith("vllm_service_link_key_dir = %r" % (value,)) and " Fix: " in err
    assert vs.check([solo], dict(NATIVE, link_key_dir=value), HOSTS, ADDRS) == []
    assert vs.check([tp], dict(NATIVE, link_key_dir="/home/me/.uma-vllm-keys"), HOSTS, ADDRS) == []
