"""Multi-node command lines of uma.vllm.vllm_service through vLLM 0.32's REAL parser and
engine-config builder.

Two CPU containers cannot run one tensor-parallel engine, so what the role renders for a
two-node engine (tensor_parallel_size 2, nnodes 2) is proven here instead: the rank-0 API
command and the headless rank-1 command (backend mp), the Ray head (backend ray), for the
native runtime (the lab's venv), docker with an NGC image and podman with vllm/vllm-openai.
One process in the lab image (test_vllm_parser_oracle's venv and image) does for each argv
what ``vllm serve`` does before it starts anything: FlexibleArgumentParser +
ServeSubcommand (parse, validate), AsyncEngineArgs.from_cli_args and
create_engine_config(headless=...), and reports the parallel config vLLM derived.

The Molecule scenario ``cluster`` runs MULTINODE_ORACLE again on the configs the role
wrote on its two lab nodes (molecule/cluster/tests/test_cluster.py).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import Any, Dict, List

import pytest
from test_vllm_parser_oracle import ROOT, _require, plan_mod, run_in_lab

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs

MULTINODE_ORACLE = r"""
import contextlib, io, json, sys, traceback
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs

cmd = ServeSubcommand()
parser = FlexibleArgumentParser(description="vLLM CLI")
cmd.subparser_init(parser.add_subparsers(required=False, dest="subparser"))
ARGS = ["tensor_parallel_size", "nnodes", "node_rank", "master_addr", "master_port",
        "distributed_executor_backend", "kv_cache_memory_bytes", "max_model_len", "enforce_eager"]
PARALLEL = ["distributed_executor_backend", "world_size", "nnodes", "node_rank", "nnodes_within_dp",
            "node_rank_within_dp", "local_world_size", "master_addr", "master_port",
            "data_parallel_size_local", "tensor_parallel_size"]
out = []
for case in json.load(open(sys.argv[1])):
    argv, entry = case["argv"], {"id": case["id"]}
    err = io.StringIO()
    try:
        assert argv[:2] == ["vllm", "serve"], argv[:2]
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
        cmd.validate(args)
        if getattr(args, "model_tag", None):
            args.model = args.model_tag
        engine = AsyncEngineArgs.from_cli_args(args)
        entry["parsed"] = {f: getattr(engine, f, None) for f in ARGS}
        entry["parsed"]["model"] = engine.model
        entry["parsed"]["headless"] = bool(args.headless)
        entry["parsed"]["host"], entry["parsed"]["port"] = args.host, args.port
    except SystemExit as exc:
        entry["parse_error"] = "exit %s: %s" % (exc.code, err.getvalue()[-1500:])
        out.append(entry)
        continue
    except Exception:
        entry["parse_error"] = traceback.format_exc()[-1500:]
        out.append(entry)
        continue
    try:
        # what run_server / run_headless build first
        config = engine.create_engine_config(headless=bool(args.headless))
        p = config.parallel_config
        entry["parallel"] = {f: getattr(p, f, None) for f in PARALLEL}
    except Exception as exc:
        entry["config_error"] = "%s: %s" % (type(exc).__name__, str(exc)[:600])
    out.append(entry)
json.dump(out, open(sys.argv[2], "w"), default=str)
"""


def engine_command(config: Dict[str, Any]) -> List[str]:
    """The full argv of a launcher config, composed as roles/launch_wrapper/tasks/engine.yml does:
    command + model + --host/--port + args."""
    model = (
        [config["model_path"]]
        if config.get("model_flag", "--model") == ""
        else [config.get("model_flag", "--model"), config["model_path"]]
    )
    return [*config["command"], *model, "--host", config["host"], "--port", str(config["port"]), *config["args"]]


def vllm_argv(command: List[str], image: str = "") -> List[str]:
    """The ``vllm serve ...`` part of a rendered engine command, whatever runs it: the lab's
    ``python -m vllm.entrypoints.openai.api_server``, ``vllm-serve-lab``, ``sh -c '... exec "$0" "$@"' vllm serve``,
    ``docker run ... IMAGE vllm serve`` or an image whose entrypoint is ``vllm serve``."""
    for i in range(len(command) - 1):
        if command[i : i + 2] == ["vllm", "serve"]:
            return command[i:]
    for i in range(len(command) - 2):
        if command[i + 1 : i + 3] == ["-m", "vllm.entrypoints.openai.api_server"]:
            return ["vllm", "serve", *command[i + 3 :]]
    for i, word in enumerate(command):
        if word.endswith("/vllm-serve-lab"):  # the lab's `vllm serve` (lab/vllm-serve-lab.py)
            return ["vllm", "serve", *command[i + 1 :]]
    if image and image in command:
        return ["vllm", "serve", *command[command.index(image) + 1 :]]
    raise AssertionError("no vLLM command in %s" % shlex.join(command))


def run_oracle(cases: List[Dict[str, Any]], work: str, mounts: List[str]) -> Dict[str, Dict[str, Any]]:
    """MULTINODE_ORACLE over ``cases`` ([{id, argv}]) in one lab container."""
    return {r["id"]: r for r in run_in_lab(MULTINODE_ORACLE, cases, work, mounts, what="the multi-node oracle")}


# --------------------------------------------------------------------------

HEAD_ADDR = "10.99.0.1"
WORKER_ADDR = "10.99.0.2"
NODES = ["spark-a", "spark-b"]
RUNTIMES = {
    "native": {
        "runtime": "native",
        "native_command": ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
        "native_model_flag": "--model",
    },
    "docker-ngc": {
        "runtime": "container",
        "container_engine": "docker",
        "container_bin": "/usr/bin/docker",
        "image": "nvcr.io/nvidia/vllm:26.02-py3",
        "container_gpus": "all",
        "hf_cache": "/root/.cache/huggingface",
        "container_options": ["--ulimit", "memlock=-1"],
    },
    "podman-openai": {
        "runtime": "container",
        "container_engine": "podman",
        "container_bin": "/usr/bin/podman",
        "image": "vllm/vllm-openai:v0.32.0",
        "container_gpus": "all",
        "hf_cache": "/root/.cache/huggingface",
        "container_options": [],
    },
}


def _render(model_dir: str, backend: str, rank: int, runtime: str) -> Dict[str, Any]:
    hostname = NODES[rank]
    engine_def = {
        "name": "tp2-" + backend,
        "port": 8100,
        "model_path": model_dir,
        "nodes": NODES,
        "backend": backend,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "plan": {"tensor_parallel_size": 2, "max_model_len": 512, "max_num_seqs": 4, "extra_args": ["--enforce-eager"]},
    }
    (engine,) = vs.host_engines([engine_def], hostname, "mp")
    settings = dict(
        RUNTIMES[runtime],
        api_host="0.0.0.0",
        ray_command=["ray"],
        node_addr=[HEAD_ADDR, WORKER_ADDR][rank],
        ifnames={"nccl": "enp1s0f1np1", "gloo": "enp1s0f1np1", "ucx": "enp1s0f1np1"},
    )
    plan = plan_mod.plan(
        {
            "model_path": model_dir,
            "total_memory_gib": 23.0,
            "reserve_gib": 4.0,
            "vllm_version": "0.32.0",
            "nnodes": 2,
            "node_rank": rank,
            "master_addr": HEAD_ADDR,
            "master_port": engine["cluster"]["master_port"],
            "env": engine["env"],
            **engine["plan"],
        }
    )
    config = vs.launch_config(engine, plan, settings, {NODES[0]: HEAD_ADDR})
    return {"config": config, "plan": plan, "command": engine_command(config), "image": settings.get("image", "")}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    _require()
    out = tmp_path_factory.mktemp("mn-model") / "tiny"
    subprocess.run([sys.executable, str(ROOT / "lab" / "make_model.py"), "--out", str(out)], check=True, timeout=300)
    return str(out)


@pytest.fixture(scope="module")
def rendered(model_dir):
    return {
        (backend, rank, runtime): _render(model_dir, backend, rank, runtime)
        for backend in ("mp", "ray")
        for rank in (0, 1)
        for runtime in RUNTIMES
    }


@pytest.fixture(scope="module")
def oracle(rendered, model_dir, tmp_path_factory):
    cases = []
    for (backend, rank, runtime), r in rendered.items():
        if backend == "ray" and rank == 1:
            continue  # a Ray worker only joins the cluster: no vLLM argv
        cases.append({"id": "%s-%d-%s" % (backend, rank, runtime), "argv": vllm_argv(r["command"], r["image"])})
    # negative control: vLLM itself refuses --nnodes with Ray, which is why the role drops it
    ray_head = vllm_argv(rendered[("ray", 0, "native")]["command"])
    cases.append({"id": "ray-with-nnodes", "argv": [*ray_head, "--nnodes", "2"]})
    work = str(tmp_path_factory.mktemp("mn-oracle"))
    return run_oracle(cases, work, ["%s:%s:ro" % (model_dir, model_dir)])


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_rank0_serves_the_api_over_two_nodes(oracle, rendered, runtime):
    result = oracle["mp-0-%s" % runtime]
    assert "parse_error" not in result and "config_error" not in result, result
    r = rendered[("mp", 0, runtime)]
    parsed, parallel = result["parsed"], result["parallel"]
    assert parsed["headless"] is False and parsed["port"] == 8100 and parsed["host"] == "0.0.0.0"
    assert parsed["kv_cache_memory_bytes"] == r["plan"]["budget"]["kv_cache_bytes"]
    assert parsed["enforce_eager"] is True
    assert parallel == dict(
        parallel,
        distributed_executor_backend="mp",
        world_size=2,
        tensor_parallel_size=2,
        nnodes=2,
        node_rank=0,
        local_world_size=1,
        master_addr=HEAD_ADDR,
        master_port=29501,
    )


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_rank1_is_a_headless_worker_of_rank0(oracle, rendered, runtime):
    result = oracle["mp-1-%s" % runtime]
    assert "parse_error" not in result and "config_error" not in result, result
    parallel = result["parallel"]
    assert result["parsed"]["headless"] is True
    # run_headless: node_rank_within_dp > 0 starts the MultiprocExecutor's workers, which
    # join rank 0's torch.distributed group at master_addr:master_port
    assert parallel["node_rank_within_dp"] == 1 and parallel["nnodes_within_dp"] == 2
    assert parallel["local_world_size"] == 1 and parallel["data_parallel_size_local"] >= 1
    assert (parallel["master_addr"], parallel["master_port"]) == (HEAD_ADDR, 29501)
    config = rendered[("mp", 1, runtime)]["config"]
    assert config["health_url"] == "http://%s:8100/health" % HEAD_ADDR  # its load is done when rank 0 serves
    assert config["env"]["VLLM_HOST_IP"] == WORKER_ADDR and config["env"]["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_ray_head_argv_is_valid_up_to_ray_itself(oracle, runtime):
    result = oracle["ray-0-%s" % runtime]
    assert "parse_error" not in result, result
    assert result["parsed"]["distributed_executor_backend"] == "ray"
    assert result["parsed"]["nnodes"] == 1 and result["parsed"]["tensor_parallel_size"] == 2
    # the lab venv has no ray: vLLM validated model, cache and parallel config and stopped
    # exactly at its Ray import
    assert "Failed to import Ray" in result.get("config_error", ""), result


def test_vllm_refuses_nnodes_with_ray(oracle):
    result = oracle["ray-with-nnodes"]
    assert "nnodes > 1 can only be set when distributed executor backend is mp" in result.get("config_error", ""), (
        result
    )


def test_ray_commands_follow_nvidias_recipe(rendered):
    head = rendered[("ray", 0, "docker-ngc")]["command"]
    worker = rendered[("ray", 1, "docker-ngc")]["command"]
    image = RUNTIMES["docker-ngc"]["image"]
    for command in (head, worker):
        assert command[command.index("--entrypoint") + 1] == "/bin/sh"
        assert {"--network", "host"} <= set(command) and command[command.index("--ipc") + 1] == "host"
        assert command[command.index("--gpus") + 1] == "all"
    head_script = head[head.index(image) + 2]
    assert head[head.index(image) + 1] == "-c"
    assert head_script == 'ray start --head --port=6379 --node-ip-address=%s && exec "$0" "$@"' % HEAD_ADDR
    worker_script = worker[worker.index(image) + 2]
    assert worker_script == "exec ray start --block --address=%s:6379 --node-ip-address=%s" % (HEAD_ADDR, WORKER_ADDR)
    for name in (
        "RAY_memory_monitor_refresh_ms",
        "VLLM_HOST_IP",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "UCX_NET_DEVICES",
        "TP_SOCKET_IFNAME",
        "OMPI_MCA_btl_tcp_if_include",
    ):
        assert command[command.index(name) - 1] == "-e", name


def test_the_runtime_changes_only_the_prefix(rendered):
    for backend in ("mp", "ray"):
        for rank in (0, 1):
            if (backend, rank) == ("ray", 1):
                continue
            flags = {
                runtime: [
                    w
                    for w in vllm_argv(
                        rendered[(backend, rank, runtime)]["command"], rendered[(backend, rank, runtime)]["image"]
                    )[2:]
                    if w != "--model"
                ]
                for runtime in RUNTIMES
            }
            assert flags["native"] == flags["docker-ngc"] == flags["podman-openai"], (backend, rank)
