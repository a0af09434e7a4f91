# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every engine of a node budgeted together (issue 14 item 3), on real plans."""

from __future__ import annotations

import json
import pathlib

from ansible_collections.uma.vllm.plugins.filter.node_budget import node_budget
from ansible_collections.uma.vllm.plugins.module_utils.node.base.plan import StartPlan
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod
from ansible_collections.uma.vllm.plugins.module_utils.plan.node_budget import engine_row, plan_node

GIB = 1 << 30
MODELS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "models"
LLAMA8B = json.loads((MODELS / "llama-3-8b" / "config.json").read_text())
QWEN = json.loads((MODELS / "qwen2.5-1.5b-instruct" / "config.json").read_text())


def plan(config, weights, **extra):
    params = dict(model="m", model_config=config, weights_bytes=weights, total_memory_gib=119.7)
    params.update(extra)
    return plan_mod.plan(params)["budget"]


def llama(**extra):
    return plan(LLAMA8B, 16060522496, max_model_len=8192, **extra)


def test_two_engines_that_fit():
    a, b = llama(max_num_seqs=64), plan(QWEN, 3087467520, max_model_len=32768, max_num_seqs=16)
    result = plan_node("ai1", [{"name": "a", "budget": a}, {"name": "b", "budget": b}])
    assert result["errors"] == []
    assert result["available_bytes"] == a["expected_available_bytes"]
    for row in result["engines"]:
        assert row["needs_free_bytes"] <= result["available_bytes"] and row["short_bytes"] == 0
    assert "node ai1: 2 started engine(s)" in result["table"] and "headroom" in result["table"]


def test_a_set_that_does_not_fit_names_the_engine_and_the_amount():
    small = llama(max_num_seqs=64)
    big = llama(kv_budget="max")  # claims all the room left after the reserve
    result = plan_node("ai1", [{"name": "small", "budget": small}, {"name": "big", "budget": big}])
    assert len(result["errors"]) == 1
    msg = result["errors"][0]
    rows = {r["engine"]: r for r in result["engines"]}
    short = max(r["short_bytes"] for r in rows.values())
    all_loaded = sum(r["footprint_bytes"] for r in rows.values())
    assert short == max(
        r["start_request_bytes"] + all_loaded - r["footprint_bytes"] - result["available_bytes"] for r in rows.values()
    )
    assert "Fix: shrink engine big" in msg and "by at least %.2f GiB" % (short / float(GIB)) in msg
    # shrinking the named engine by that much makes every start fit
    rows["big"]["footprint_bytes"] -= short
    rows["big"]["start_request_bytes"] -= short
    total = sum(r["footprint_bytes"] for r in rows.values())
    for r in rows.values():
        assert r["start_request_bytes"] + total - r["footprint_bytes"] <= result["available_bytes"]
    assert "REFUSED" in result["table"]


def test_each_alone_fits_but_three_do_not():
    engines = [{"name": n, "budget": llama(max_num_seqs=256)} for n in ("x", "y", "z")]
    alone = plan_node("n", engines[:1])
    assert alone["errors"] == []
    result = plan_node("n", engines)
    assert result["errors"] and "do not fit together" in result["errors"][0]


def test_stopped_engines_and_ranks():
    two_ranks = llama(max_num_seqs=8, tensor_parallel_size=2)
    row = engine_row("tp2", StartPlan.read(two_ranks))
    assert row["ranks"] == 2 and row["footprint_bytes"] == 2 * (
        two_ranks["weights_per_rank_bytes"] + two_ranks["activation_reserve_bytes"] + two_ranks["kv_cache_bytes"]
    )
    big = llama(kv_budget="max")
    result = plan_node("n", [{"name": "big", "budget": big}, {"name": "off", "budget": big, "started": False}])
    assert result["errors"] == [] and [r["engine"] for r in result["engines"]] == ["big"]


def test_plans_without_total_are_shown_not_checked():
    budget = plan(LLAMA8B, 16060522496, max_model_len=8192, kv_cache_memory_bytes=4 * GIB, total_memory_gib=None)
    result = plan_node("n", [{"name": "a", "budget": budget}, {"name": "b", "budget": budget}])
    assert result["errors"] == [] and result["available_bytes"] is None
    assert "no total_memory_gib" in result["table"]


def test_filter_reads_registered_loop_results():
    small, big = llama(max_num_seqs=64), llama(kv_budget="max")
    results = [
        {"item": {"name": "small", "state": "started"}, "budget": small},
        {"item": {"name": "big", "state": "started"}, "budget": big},
        {"item": {"name": "idle", "state": "stopped"}, "budget": big},
    ]
    out = node_budget(results, "ai1")
    assert out["errors"] and out["errors"][0].startswith("ai1: ")
    assert [r["engine"] for r in out["engines"]] == ["small", "big"]
