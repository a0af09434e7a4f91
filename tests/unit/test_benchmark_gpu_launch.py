"""benchmarks/gpu_launch_check.py's recorded run on an NVIDIA H200 (the planner and the launcher on a real
discrete card; the engine is lab/vm/uma_loader.py --driver cuda, a stand-in: vLLM is not on that machine).

The run needs the GPU (not here); its output is
tests/unit/fixtures/platform/nvidia-h200-driver-580.159.04/gpu_launch_check.{json,txt}. These tests hold
today's code to what the card showed: the CUDA context the planner and the launcher leave free covers every
context measured there, vLLM's startup rule (the stand-in's) explains each engine's fate, and the launcher's
GPU admission, replayed on the recorded nvidia-smi figures, decides as it did there.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.module_utils import _launch_node
from ansible_collections.uma.vllm.plugins.module_utils import _vllm_plan_budget as budget_mod

ROOT = pathlib.Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "unit" / "fixtures" / "platform" / "nvidia-h200-driver-580.159.04"
RUN = json.loads((H200 / "gpu_launch_check.json").read_text())
CASES = {case["case"]: case for case in RUN["cases"]}
GIB = 1 << 30
MIB = 1 << 20


def _loader():
    spec = importlib.util.spec_from_file_location("uma_loader_h200", ROOT / "lab" / "vm" / "uma_loader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recorded_run_is_whole():
    assert RUN["machine"]["gpus"][0]["name"] == "NVIDIA H200" and RUN["machine"]["gpus"][0]["driver"] == "580.159.04"
    assert set(CASES) == {"launch", "edge-old", "edge-old-gpu", "edge-old-host", "edge-new", "hog-gpu", "hog-host"}
    assert RUN["all_as_expected"] is True


def test_the_cuda_context_left_free_covers_every_context_measured_on_the_card():
    assert budget_mod.CUDA_CONTEXT_BYTES == _launch_node.CUDA_CONTEXT_BYTES  # planner and launcher: one figure
    ctx = RUN["context"]
    contexts = [ctx["cuda_total"] - ctx["cuda_free"], ctx["context_mib"] * MIB]
    # each engine's own: the card's total minus what its startup snapshot saw free (an idle card)
    contexts += [
        c["stand_in_facts"]["total_at_check"] - c["stand_in_facts"]["free_at_check"]
        for c in RUN["cases"]
        if c["used_before_mib"] == 0 and c["stand_in_facts"].get("free_at_check")
    ]
    # the earlier run on another H200 (benchmarks/gpu_memory_check.py)
    contexts.append(json.loads((H200 / "gpu_memory_check.json").read_text())["context"]["used_after_init"])
    assert len(contexts) >= 5
    assert max(contexts) <= budget_mod.CUDA_CONTEXT_BYTES, [c / MIB for c in contexts]
    # and the figure refuted there stays refuted: 0.55 GiB left less than this card's context
    assert max(contexts) > 0.55 * GIB


@pytest.mark.parametrize("name", ["launch", "edge-old", "edge-new", "hog-host"])
def test_each_engine_fate_is_vllms_startup_rule_on_what_it_saw(name):
    loader = _loader()
    case = CASES[name]
    facts = case["stand_in_facts"]
    requested = math.ceil(facts["total_at_check"] * case["gmu"])
    assert facts["requested_at_check"] == requested
    passes = facts["free_at_check"] >= requested
    if passes:
        assert loader.startup_check(facts["free_at_check"], facts["total_at_check"], case["gmu"]) == requested
        assert case["healthy"] and case["exit_code"] == 0 and case["completion_ok"]
        assert case["used_after_mib"] == 0  # stopped: the card's memory back
    else:
        with pytest.raises(loader.LoaderError, match="less than desired GPU memory utilization"):
            loader.startup_check(facts["free_at_check"], facts["total_at_check"], case["gmu"])
        assert not case["healthy"] and case["exit_code"] == 1
        assert any("less than desired GPU memory utilization" in line for line in case["engine_errors"])


@pytest.mark.parametrize("name", ["launch", "edge-old-gpu", "edge-new", "hog-gpu"])
def test_the_gpu_admission_replayed_on_the_recorded_cards_decides_as_it_did(name):
    case = CASES[name]
    adm = case["admission"]
    plan = {"launch": "launch", "hog-gpu": "launch", "edge-old-gpu": "old_edge", "edge-new": "new_edge"}[name]
    budget = RUN["plans"][plan]["budget"]
    need, _source = _launch_node.gpu_need({"plan": budget, "admission_request_bytes": None})
    assert need == adm["need_bytes"] == budget["requested_memory_bytes"] + budget["cuda_context_bytes"]
    admitted = all(gpu["free_bytes"] >= need for gpu in adm["gpus"])
    assert admitted is adm["admitted"]
    assert case["exit_code"] == (0 if admitted else 75)


def test_the_host_admission_was_wrong_both_ways_on_a_discrete_card():
    # before the fix every plan was admitted on host MemAvailable: it refused a start for host RAM's size
    # and admitted one the card could not hold (the engine's own check then failed)
    refused, admitted = CASES["edge-old-host"]["admission"], CASES["hog-host"]["admission"]
    assert refused["memory"] == "host" and refused["admitted"] is False
    assert refused["mem_available_bytes"] < refused["need_bytes"] < RUN["context"]["cuda_total"]
    assert admitted["memory"] == "host" and admitted["admitted"] is True and CASES["hog-host"]["exit_code"] == 1


def test_the_old_edge_plan_and_the_new_default():
    plans = RUN["plans"]
    assert plans["old_edge"]["ok"] and plans["old_edge"]["reserve_bytes"] == 0 and plans["old_edge"]["gmu"] == 0.998
    assert not plans["new_same_kv"]["ok"] and "reserve 0.75" in plans["new_same_kv"]["refused"]
    new = plans["new_edge"]["budget"]
    assert new["reserve_bytes"] == budget_mod.CUDA_CONTEXT_BYTES
    assert new["total_memory_bytes"] - new["requested_memory_bytes"] >= budget_mod.CUDA_CONTEXT_BYTES
