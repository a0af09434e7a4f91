# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The MemAvailable rule (_memavail) against the lab kernel's own numbers, and the
planner's use of it on unified memory (issue 14, items 1 and 2)."""

from __future__ import annotations

import json
import math
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import memavail as ma
from ansible_collections.uma.vllm.plugins.module_utils.node.base import plan as _contract
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod
from ansible_collections.uma.vllm.plugins.module_utils.system import sysctl as _sysctl

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
GIB = 1 << 30
MIB = 1 << 20
LLAMA8B = json.loads((FIX / "models" / "llama-3-8b" / "config.json").read_text())


def _meminfo(text):
    out = {}
    for line in text.splitlines():
        key, _sep, rest = line.partition(":")
        out[key] = int(rest.split()[0]) * 1024
    return out


def test_kernel_formula_reproduces_the_lab_kernel():
    # /proc/meminfo and /proc/zoneinfo read one after the other on the lab VM (kernel 6.18)
    info = _meminfo((FIX / "memavail" / "lab-meminfo.txt").read_text())
    zones = ma.parse_zoneinfo((FIX / "memavail" / "lab-zoneinfo.txt").read_text())
    assert {"0/DMA", "0/DMA32", "0/Normal"} <= set(zones)
    assert zones["0/DMA32"]["protection"][2] > 0
    assert abs(ma.kernel_mem_available(info, zones) - info["MemAvailable"]) <= 4 * MIB


LAB = json.loads((FIX / "memavail" / "lab-drops.json").read_text())


@pytest.mark.parametrize(
    "row", LAB["rows"], ids=lambda r: "wsf%d-mfk%d" % (r["watermark_scale_factor"], r["min_free_kbytes"])
)
def test_rule_never_below_the_measured_drop(row):
    own = LAB["own"]
    total = row["memtotal_bytes"]
    rule = ma.watermark_reserve(total, row["min_free_kbytes"], row["watermark_scale_factor"])["reserve_bytes"]
    base = ma.watermark_reserve(total, own["min_free_kbytes"], own["watermark_scale_factor"])["reserve_bytes"]
    # each drop is the median of 3 (before, during, after) reads; the spread is other activity
    assert rule - base >= row["measured_drop_bytes"] - row["measured_drop_spread_bytes"] - 2 * MIB
    # the kernel formula recomputed from the same reads moved exactly like MemAvailable
    assert abs(row["kernel_formula_drop_bytes"] - row["measured_drop_bytes"]) <= MIB


def test_measured_slope_is_between_floor_and_rule():
    # default scale factor: MemAvailable fell 2.8-2.9x the raise, the floor (high) is 1.5x, the rule 4x
    for row in LAB["rows"]:
        raise_bytes = (row["min_free_kbytes"] - LAB["own"]["min_free_kbytes"]) * 1024
        if row["watermark_scale_factor"] != 10 or raise_bytes < 500 * MIB:
            continue
        slope = row["measured_drop_bytes"] / raise_bytes
        assert 1.5 < slope < 4.0


def test_watermarks_follow_the_kernel():
    marks = ma.watermarks(128 * GIB, 1048576)
    assert marks == {"min": GIB, "low": GIB + GIB // 4, "high": GIB + GIB // 2}
    # a large scale factor beats min/4: 1% of 128 GiB
    marks = ma.watermarks(128 * GIB, 65536, 100)
    assert marks["low"] - marks["min"] == 128 * GIB // 100


def test_uma_sysctl_sizing_reports_the_same_rule():
    sizing = _sysctl.size_min_free_kbytes(121 * GIB)
    assert sizing["min_free_kbytes"] == 3801088
    assert sizing["memavailable_reserve_bytes"] == ma.watermark_reserve(121 * GIB, 3801088)["reserve_bytes"]
    expected = ma.expected_available(121 * GIB, baseline_bytes=0)
    assert expected["min_free_kbytes"] == sizing["min_free_kbytes"]
    assert expected["min_free_kbytes_source"] == "uma_sysctl rule uma-3pct-v1"
    assert expected["available_bytes"] == 121 * GIB - sizing["memavailable_reserve_bytes"]


def test_expected_available_refuses_a_bad_scale_factor():
    with pytest.raises(UmaError) as err:
        ma.expected_available(128 * GIB, scale_factor=5000)
    assert "watermark_scale_factor" in err.value.message and "1..3000" in err.value.message


def _plan(**extra):
    params = dict(model="m", model_config=LLAMA8B, weights_bytes=16060522496, max_model_len=8192, max_num_seqs=64)
    params.update(extra)
    return plan_mod.plan(params)


@pytest.mark.parametrize("kv_budget", ["fit", "max"])
@pytest.mark.parametrize("total_gib", [119.7, 128.0, 64.0])
def test_default_reserve_fits_the_modelled_memavailable(total_gib, kv_budget):
    result = _plan(total_memory_gib=total_gib, kv_budget=kv_budget)
    budget = result["budget"]
    total = int(total_gib * GIB)
    expected = ma.expected_available(total)
    assert budget["expected_available_bytes"] == expected["available_bytes"]
    assert budget["reserve_bytes"] == total - expected["available_bytes"]
    # vLLM requests ceil(total x util) free at start: within the modelled MemAvailable
    assert math.ceil(total * budget["gpu_memory_utilization"]) <= expected["available_bytes"]
    assert budget["gpu_memory_utilization"] < 1
    assert budget["reserve_source"].startswith("derived: node baseline 3.00 GiB (default) + watermark reserve")
    assert "reserve from derived" in result["msg"] and "expected MemAvailable at start" in result["msg"]


def test_derived_reserve_follows_the_node_knobs():
    # min/4 above the scale factor's 0.1% of RAM: low = 1.25 m, high = 1.5 m, reserve grows 4 m
    low = _plan(total_memory_gib=119.7, min_free_kbytes=1048576, node_baseline_gib=2)["budget"]
    high = _plan(total_memory_gib=119.7, min_free_kbytes=5242880, node_baseline_gib=2)["budget"]
    assert high["reserve_bytes"] - low["reserve_bytes"] == 4 * (5242880 - 1048576) * 1024
    others = _plan(total_memory_gib=119.7, min_free_kbytes=1048576, node_baseline_gib=2, other_engines_gib=30)
    assert others["budget"]["reserve_bytes"] - low["reserve_bytes"] == 30 * GIB


def test_a_reserve_below_the_kernel_floor_is_refused_with_the_fix():
    with pytest.raises(plan_mod.PlanRefused) as err:
        _plan(total_memory_gib=119.7, reserve_gib=0)
    msg = err.value.message
    assert "option 'reserve_gib' = 0" in msg
    assert "MemAvailable will be at most" in msg and "totalreserve_pages" in msg
    assert "Give reserve_gib >= 5.82" in msg
    details = err.value.details
    assert (
        details["reserve_floor_bytes"] > 5.8 * GIB and details["reserve_needed_bytes"] > details["reserve_floor_bytes"]
    )


def test_a_reserve_between_floor_and_rule_warns():
    result = _plan(total_memory_gib=119.7, reserve_gib=12)
    assert any("below the modelled" in w for w in result["warnings"])
    assert result["budget"]["reserve_bytes"] == 12 * GIB


def test_a_covering_reserve_says_so():
    result = _plan(total_memory_gib=119.7, reserve_gib=20)
    assert result["budget"]["reserve_source"].startswith("reserve_gib (covers the modelled")
    assert not any("below the modelled" in w for w in result["warnings"])


def test_discrete_plans_reserve_the_cuda_context_and_unsized_plans_zero():
    # a discrete card: vLLM's startup check runs after the CUDA context took its share of the card
    budget = _plan(total_memory_gib=79.18, unified_memory=False)["budget"]
    assert budget["reserve_bytes"] == _contract.CUDA_CONTEXT_BYTES == int(0.75 * GIB)
    assert budget["reserve_source"].startswith("derived: the CUDA context")
    assert budget["unified_memory"] is False and budget["cuda_context_bytes"] == _contract.CUDA_CONTEXT_BYTES
    assert budget["gpus_per_node"] == 1
    # a given reserve is the user's (0 included)
    assert _plan(total_memory_gib=79.18, unified_memory=False, reserve_gib=0)["budget"]["reserve_bytes"] == 0
    budget = _plan(kv_cache_memory_bytes=2 * GIB)["budget"]
    assert budget["reserve_bytes"] == 0 and budget["expected_available_bytes"] is None
    assert budget["unified_memory"] is True and budget["cuda_context_bytes"] is None


def test_eager_module_loading_keeps_the_larger_context():
    # CUDA_MODULE_LOADING=EAGER in the engine's env: 1258-1260 MiB per context on an H200 and an H100
    # (docs/BENCHMARKS.md), more than the lazy 0.75 GiB: the plan keeps 1.5 GiB and says why
    lazy = _plan(total_memory_gib=79.18, unified_memory=False, kv_cache_memory_bytes=8 * GIB)["budget"]
    for value in ("EAGER", "eager", " Eager "):
        eager = _plan(total_memory_gib=79.18, unified_memory=False, kv_cache_memory_bytes=8 * GIB,
                      env={"CUDA_MODULE_LOADING": value})["budget"]  # fmt: skip
        assert eager["reserve_bytes"] == eager["cuda_context_bytes"] == _contract.CUDA_CONTEXT_EAGER_BYTES
        assert eager["reserve_source"] == "derived: the CUDA context with env CUDA_MODULE_LOADING=EAGER (1.50 GiB)"
        # the same KV cache and gmu's request: only what is kept free differs
        assert eager["requested_memory_bytes"] == lazy["requested_memory_bytes"]
    assert lazy["reserve_bytes"] == lazy["cuda_context_bytes"] == _contract.CUDA_CONTEXT_BYTES
    lazy_env = _plan(total_memory_gib=79.18, unified_memory=False, env={"CUDA_MODULE_LOADING": "LAZY"})["budget"]
    assert lazy_env["reserve_bytes"] == _contract.CUDA_CONTEXT_BYTES
    # the largest KV a lazy plan takes is refused with eager loading (the room is 0.75 GiB smaller)
    with pytest.raises(plan_mod.PlanRefused) as err:
        room = None
        try:
            _plan(total_memory_gib=79.18, unified_memory=False, kv_cache_memory_bytes=200 * GIB)
        except plan_mod.PlanRefused as lazy_err:
            room = lazy_err.details["kv_room_bytes"]
        _plan(total_memory_gib=79.18, unified_memory=False, kv_cache_memory_bytes=room,
              env={"CUDA_MODULE_LOADING": "EAGER"})  # fmt: skip
    assert "reserve 1.50" in err.value.message
    # a given reserve stays the user's, eager or not; unified memory has no CUDA context figure
    given = _plan(total_memory_gib=79.18, unified_memory=False, reserve_gib=1, env={"CUDA_MODULE_LOADING": "EAGER"})
    assert given["budget"]["reserve_bytes"] == GIB
    unified = _plan(kv_cache_memory_bytes=2 * GIB, env={"CUDA_MODULE_LOADING": "EAGER"})["budget"]
    assert unified["cuda_context_bytes"] is None


def test_a_discrete_plan_leaves_the_cuda_context_free():
    # docs/BENCHMARKS.md (H200, 139.80 GiB): a pinned KV cache that left 0.41 GiB of the card free
    # was planned at --gpu-memory-utilization 0.998, but the CUDA context alone holds 0.51-0.60 GiB before
    # vLLM's startup check. Now the plan keeps 0.75 GiB: the same KV cache is refused, with the fit.
    total = int(139.80 * GIB)
    base = _plan(total_memory_gib=139.80, unified_memory=False, kv_cache_memory_bytes=4 * GIB)["budget"]
    kv = total - base["weights_per_rank_bytes"] - base["activation_reserve_bytes"] - int(0.41 * GIB)
    zero = _plan(total_memory_gib=139.80, unified_memory=False, kv_cache_memory_bytes=kv, reserve_gib=0)
    assert zero["budget"]["gpu_memory_utilization"] >= 0.997
    with pytest.raises(plan_mod.PlanRefused) as err:
        _plan(total_memory_gib=139.80, unified_memory=False, kv_cache_memory_bytes=kv)
    assert "reserve 0.75" in err.value.message
    # the KV cache was pinned: the fix names the largest one that fits, and it does fit
    assert err.value.option == "kv_cache_memory_bytes" and "Give kv_cache_memory_bytes <= " in err.value.message
    room = err.value.details["kv_room_bytes"]
    assert room < kv and _plan(total_memory_gib=139.80, unified_memory=False, kv_cache_memory_bytes=room)["budget"]
    fits = _plan(total_memory_gib=139.80, unified_memory=False, kv_cache_memory_bytes=kv - int(0.4 * GIB))["budget"]
    assert fits["total_memory_bytes"] - fits["requested_memory_bytes"] >= _contract.CUDA_CONTEXT_BYTES


def test_a_given_baseline_counts_in_the_floor():
    # the default baseline is an assumption and never refuses; a given one does
    assert _plan(total_memory_gib=119.7, reserve_gib=8)["budget"]["reserve_bytes"] == 8 * GIB
    with pytest.raises(plan_mod.PlanRefused) as err:
        _plan(total_memory_gib=119.7, reserve_gib=8, node_baseline_gib=4)
    assert "node_baseline_gib 4.00 GiB" in err.value.message
