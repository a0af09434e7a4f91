"""The planner over the test matrix (fixtures/models/plan_matrix.yaml).

Properties every plan must have: the argv is ``vllm serve MODEL`` plus flags
the target release parses, every flag once; unified memory pins the KV budget
and the emitted --gpu-memory-utilization passes vLLM's startup check
(requested = ceil(total * util)) with the reserve still free. The same argvs
go through the real vLLM parser in tests/integration/test_vllm_parser_oracle.py.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod
from ansible_collections.uma.vllm.plugins.module_utils.plan import versions

FIXTURES = pathlib.Path(__file__).parents[3] / "unit" / "fixtures" / "models"
MATRIX = yaml.safe_load((FIXTURES / "plan_matrix.yaml").read_text())
GIB = 1 << 30


def matrix_params(case):
    params = dict(case["params"])
    params["model_config"] = json.loads((FIXTURES / case["fixture"] / "config.json").read_text())
    params.setdefault("model", "/models/%s" % case["fixture"])
    return params


@pytest.mark.parametrize("case", MATRIX, ids=[c["id"] for c in MATRIX])
def test_matrix_case(case):
    params = matrix_params(case)
    result = plan_mod.plan(params)
    argv, budget = result["argv"], result["budget"]
    assert argv[:3] == ["vllm", "serve", params["model"]]
    version = versions.parse_version("vllm_version", params.get("vllm_version", versions.DEFAULT_VERSION))
    extra = params.get("extra_args", [])
    planned = argv[3 : len(argv) - len(extra)]
    flags = [word for word in planned if word.startswith("--")]
    assert len(flags) == len(set(flags)), "a flag is emitted twice: %s" % flags
    for flag in flags:
        assert versions.flag_supported(flag, version), "%s is not parsed by vLLM %s" % (flag, versions.vstr(version))
    assert argv[len(argv) - len(extra) :] == extra

    def value(flag):
        return planned[planned.index(flag) + 1]

    assert int(value("--max-model-len")) == params["max_model_len"]
    assert int(value("--tensor-parallel-size")) == params.get("tensor_parallel_size", 1)
    total = int(params["total_memory_gib"] * GIB)
    reserve = budget["reserve_bytes"]
    if "reserve_gib" in params:
        assert reserve == int(params["reserve_gib"] * GIB)
    gmu = float(value("--gpu-memory-utilization"))
    requested = math.ceil(total * gmu)
    footprint = budget["weights_per_rank_bytes"] + budget["activation_reserve_bytes"] + budget["kv_cache_bytes"]
    if params.get("unified_memory", True):
        assert int(value("--kv-cache-memory-bytes")) == budget["kv_cache_bytes"]
        # the startup check asks for requested bytes free; with the reserve kept that must fit
        assert requested + reserve <= total
        assert requested >= footprint - total // 1000  # util is rounded to 0.001
        assert budget["free_after_plan_bytes"] >= reserve
        if "reserve_gib" not in params:
            # derived reserve: every rank's startup request fits the modelled MemAvailable
            assert budget["ranks_per_node"] * requested <= budget["expected_available_bytes"]
            assert budget["reserve_source"].startswith("derived: node baseline")
        assert any("unified memory" in w for w in result["warnings"])
    else:
        assert "--kv-cache-memory-bytes" not in planned or "kv_cache_memory_bytes" in params
    assert budget["kv_tokens"] > 0 and budget["num_blocks"] > 0
    assert budget["max_concurrency"] >= 1.0
    if params.get("nnodes", 1) > 1:
        assert value("--nnodes") == str(params["nnodes"]) and value("--node-rank") == str(params["node_rank"])
        assert value("--distributed-executor-backend") == "mp"
    assert ("--headless" in planned) is bool(params.get("node_rank", 0) > 0 or params.get("headless"))


def test_uma_budget_max_takes_the_room():
    # Llama 3 8B on a 119.7 GiB node with 12 GiB reserve: kv_budget max gives the KV cache what is left.
    params = dict(matrix_params(MATRIX[0]), kv_budget="max")
    budget = plan_mod.plan(params)["budget"]
    total = int(119.7 * GIB)
    assert budget["kv_cache_bytes"] == total - 12 * GIB - 16060522496 - budget["activation_reserve_bytes"]
    assert budget["free_after_plan_bytes"] == 12 * GIB
    assert budget["gpu_memory_utilization"] == math.floor((total - 12 * GIB) / float(total) * 1000) / 1000.0


def test_uma_budget_fit_claims_what_the_sequences_need():
    # kv_budget fit (default): 64 sequences x 8192 tokens = 64 x 512 blocks of 32 x 65536 B, plus the null block
    budget = plan_mod.plan(matrix_params(MATRIX[0]))["budget"]
    assert budget["kv_cache_bytes"] == 32 * 65536 * (64 * 512 + 1)
    assert budget["max_concurrency"] >= 64
    assert budget["kv_budget_source"] == "max_num_seqs x max_model_len"


def test_msg_is_a_budget_table():
    msg = plan_mod.plan(matrix_params(MATRIX[0]))["msg"]
    for words in ("weights per rank", "KV cache per rank", "reserve", "GPU KV cache size", "--gpu-memory-utilization"):
        assert words in msg
