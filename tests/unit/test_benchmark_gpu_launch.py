"""benchmarks/gpu_launch_check.py's recorded runs on NVIDIA H200 and H100 cards (the planner and the launcher on a
real discrete card; the engine is lab/vm/uma_loader.py --driver cuda, a stand-in: vLLM is not on those machines).

The runs need the GPU (not here); their outputs are tests/unit/fixtures/platform/<card>-driver-580.159.04/
gpu_launch_check*.{json,txt}. These tests hold today's code to what the cards showed: the CUDA context the
planner and the launcher leave free covers every context measured there (lazy and eager module loading),
vLLM's startup rule (the stand-in's) explains each engine's fate, and the launcher's GPU admission, replayed
on the recorded nvidia-smi figures, decides as it did there.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import plan as _contract
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import admission as _admission
from ansible_collections.uma.vllm.plugins.module_utils.plan import budget as budget_mod

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLATFORM = ROOT / "tests" / "unit" / "fixtures" / "platform"
H200 = PLATFORM / "nvidia-h200-driver-580.159.04"
H100 = PLATFORM / "nvidia-h100-80gb-hbm3-driver-580.159.04"
# the first H200 run (7 cases); a second H200 machine with --contexts (the same 7 cases); an H100 with
# --contexts and the two eager cases
RUNS = {
    "h200": json.loads((H200 / "gpu_launch_check.json").read_text()),
    "h200-contexts": json.loads((H200 / "gpu_launch_check_contexts.json").read_text()),
    "h100": json.loads((H100 / "gpu_launch_check.json").read_text()),
    # the same H100 command (without --contexts) with the launcher that reads the engine's env
    "h100-after": json.loads((H100 / "gpu_launch_check_after.json").read_text()),
}
CARDS = {"h200": "NVIDIA H200", "h200-contexts": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3",
         "h100-after": "NVIDIA H100 80GB HBM3"}  # fmt: skip
H100_RUNS = ("h100", "h100-after")
SEVEN = {"launch", "edge-old", "edge-old-gpu", "edge-old-host", "edge-new", "hog-gpu", "hog-host"}
GIB = 1 << 30
MIB = 1 << 20


def _cases(run):
    return {case["case"]: case for case in RUNS[run]["cases"]}


def _loader():
    spec = importlib.util.spec_from_file_location("uma_loader_h200", ROOT / "lab" / "vm" / "uma_loader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_recorded_run_is_whole(run):
    gpu = RUNS[run]["machine"]["gpus"][0]
    assert gpu["name"] == CARDS[run] and gpu["driver"] == "580.159.04"
    eager = {"edge-new-eager", "edge-eager"} if run in H100_RUNS else set()
    assert set(_cases(run)) == SEVEN | eager
    assert RUNS[run]["all_as_expected"] is True


def _engine_env(case):
    return (case.get("config_extra") or {}).get("env") or {}


def test_the_cuda_context_left_free_covers_every_context_measured_on_the_cards():
    # planner and launcher: one figure, the plan contract's
    assert budget_mod.cuda_context_bytes is _contract.cuda_context_bytes
    lazy, eager = [], []
    for run in RUNS.values():
        ctx = run["context"]
        lazy += [ctx["cuda_total"] - ctx["cuda_free"], ctx["context_mib"] * MIB]
        # each engine's own: the card's total minus what its startup snapshot saw free (an idle card)
        for c in run["cases"]:
            if c["used_before_mib"] == 0 and c["stand_in_facts"].get("free_at_check"):
                seen = c["stand_in_facts"]["total_at_check"] - c["stand_in_facts"]["free_at_check"]
                (eager if _engine_env(c).get("CUDA_MODULE_LOADING") == "EAGER" else lazy).append(seen)
        # two processes one after the other (--contexts): each one's and the second one's own view
        for row in run.get("contexts") or []:
            figures = [row["first_mib"] * MIB, row["second_mib"] * MIB]
            figures += [row["seen"][0]["cuda_total"] - row["seen"][0]["cuda_free"]]
            (eager if row["loading"] == "EAGER" else lazy).extend(figures)
    # the earlier run on another H200 (benchmarks/gpu_memory_check.py)
    lazy.append(json.loads((H200 / "gpu_memory_check.json").read_text())["context"]["used_after_init"])
    assert len(lazy) >= 20 and len(eager) >= 6
    assert max(lazy) <= _contract.CUDA_CONTEXT_BYTES, [c / MIB for c in lazy]
    # and the figure refuted there stays refuted: 0.55 GiB left less than these cards' context
    assert max(lazy) > 0.55 * GIB
    # eager module loading: twice the lazy context, over what a lazy plan keeps, under the eager figure
    assert _contract.CUDA_CONTEXT_BYTES < min(eager) and max(eager) <= _contract.CUDA_CONTEXT_EAGER_BYTES
    assert _contract.cuda_context_bytes({"CUDA_MODULE_LOADING": "EAGER"})[0] == _contract.CUDA_CONTEXT_EAGER_BYTES
    assert _contract.cuda_context_bytes({"CUDA_MODULE_LOADING": "eager "})[0] == _contract.CUDA_CONTEXT_EAGER_BYTES
    for env in ({}, {"CUDA_MODULE_LOADING": "LAZY"}, {"CUDA_MODULE_LOADING": ""}):
        assert _contract.cuda_context_bytes(env)[0] == _contract.CUDA_CONTEXT_BYTES


def test_a_second_process_sees_the_first_ones_context_taken():
    # a second engine on the same card: its startup snapshot sees the first one's context gone
    for run in ("h200-contexts", "h100"):
        for row in RUNS[run]["contexts"]:
            first, second = row["seen"]
            assert abs((first["cuda_free"] - second["cuda_free"]) - row["first_mib"] * MIB) <= 4 * MIB


FATES = [(run, name) for run in sorted(RUNS) for name in ("launch", "edge-old", "edge-new", "hog-host")]
FATES += [(run, name) for run in H100_RUNS for name in ("edge-old-host", "edge-eager")]
FATES += [("h100", "edge-new-eager")]


@pytest.mark.parametrize("run,name", FATES)
def test_each_engine_fate_is_vllms_startup_rule_on_what_it_saw(run, name):
    loader = _loader()
    case = _cases(run)[name]
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


ADMISSIONS = [(run, name) for run in sorted(RUNS) for name in ("launch", "edge-old-gpu", "edge-new", "hog-gpu")]
ADMISSIONS += [(run, name) for run in H100_RUNS for name in ("edge-new-eager", "edge-eager")]
PLAN_OF = {"launch": "launch", "hog-gpu": "launch", "edge-old-gpu": "old_edge", "edge-new": "new_edge",
           "edge-new-eager": "new_edge", "edge-eager": "eager_edge"}  # fmt: skip


@pytest.mark.parametrize("run,name", ADMISSIONS)
def test_the_gpu_admission_replayed_on_the_recorded_cards_decides_as_it_did(run, name):
    case = _cases(run)[name]
    adm = case["admission"]
    budget = RUNS[run]["plans"][PLAN_OF[name]]["budget"]
    need, source = _admission.gpu_need({"plan": budget, "admission_request_bytes": None, "env": _engine_env(case)})
    admitted = all(gpu["free_bytes"] >= need for gpu in adm["gpus"])
    if name == "edge-new-eager":
        # today the launcher adds the eager context the engine's env asks for and refuses the lazy plan before any
        # weight is read; the first H100 run (the launcher before that) admitted it on the plan's lazy context and
        # the engine's own check failed (exit 1); the run after did what today's code does (exit 75)
        assert need == budget["requested_memory_bytes"] + _contract.CUDA_CONTEXT_EAGER_BYTES
        assert "CUDA_MODULE_LOADING=EAGER" in source and admitted is False
        if run == "h100":
            assert adm["admitted"] is True and case["exit_code"] == 1
        else:
            assert adm["admitted"] is False and adm["need_bytes"] == need and case["exit_code"] == 75
            assert "CUDA_MODULE_LOADING=EAGER" in adm["need_source"] and not case["stand_in_facts"]
        return
    assert need == adm["need_bytes"] == budget["requested_memory_bytes"] + budget["cuda_context_bytes"]
    assert admitted is adm["admitted"]
    assert case["exit_code"] == (0 if admitted else 75)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_host_admission_was_wrong_both_ways_on_a_discrete_card(run):
    # before the fix every plan was admitted on host MemAvailable: on an H200 (card larger than host RAM) it
    # refused a start for host RAM's size; on an H100 (card smaller) it admitted the old edge plan that the
    # engine's own check then failed; on both it admitted one the card could not hold for another process
    cases = _cases(run)
    old, hog = cases["edge-old-host"], cases["hog-host"]
    assert old["admission"]["memory"] == "host"
    if old["admission"]["mem_available_bytes"] < old["admission"]["need_bytes"]:
        assert run.startswith("h200") and old["admission"]["admitted"] is False and old["exit_code"] == 75
        assert old["admission"]["need_bytes"] < RUNS[run]["context"]["cuda_total"]
    else:
        assert run in H100_RUNS and old["admission"]["admitted"] is True and old["exit_code"] == 1
    assert hog["admission"]["memory"] == "host" and hog["admission"]["admitted"] is True and hog["exit_code"] == 1


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_old_edge_plan_and_the_new_default(run):
    plans = RUNS[run]["plans"]
    assert plans["old_edge"]["ok"] and plans["old_edge"]["reserve_bytes"] == 0
    assert plans["old_edge"]["gmu"] == (0.995 if run in H100_RUNS else 0.998)
    assert not plans["new_same_kv"]["ok"] and "reserve 0.75" in plans["new_same_kv"]["refused"]
    new = plans["new_edge"]["budget"]
    assert new["reserve_bytes"] == _contract.CUDA_CONTEXT_BYTES
    assert new["total_memory_bytes"] - new["requested_memory_bytes"] >= _contract.CUDA_CONTEXT_BYTES


@pytest.mark.parametrize("run", H100_RUNS)
def test_the_eager_plan_keeps_the_eager_context(run):
    plans = RUNS[run]["plans"]
    eager = plans["eager_edge"]["budget"]
    assert eager["reserve_bytes"] == eager["cuda_context_bytes"] == _contract.CUDA_CONTEXT_EAGER_BYTES
    assert "CUDA_MODULE_LOADING=EAGER" in eager["reserve_source"]
    assert eager["total_memory_bytes"] - eager["requested_memory_bytes"] >= _contract.CUDA_CONTEXT_EAGER_BYTES
    # the lazy plan left less than the eager context free: why edge-new-eager failed
    lazy = plans["new_edge"]["budget"]
    assert lazy["total_memory_bytes"] - lazy["requested_memory_bytes"] < _contract.CUDA_CONTEXT_EAGER_BYTES


# --release 30 --only-release on a third H200 machine and another H100: another process holds all but
# (request - 2 GiB) of the card and lets it go 30 s after the launch starts (a stopping engine), once per case
RELEASE = {
    "h200": json.loads((H200 / "gpu_launch_check_release.json").read_text()),
    "h100": json.loads((H100 / "gpu_launch_check_release.json").read_text()),
}
RELEASE_CARDS = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}


def _release(run, name):
    return {case["case"]: case for case in RELEASE[run]["cases"]}[name]


@pytest.mark.parametrize("run", sorted(RELEASE))
def test_the_release_run_is_whole(run):
    gpu = RELEASE[run]["machine"]["gpus"][0]
    assert gpu["name"] == RELEASE_CARDS[run] and gpu["driver"] == "580.159.04"
    assert [case["case"] for case in RELEASE[run]["cases"]] == ["release-direct", "release-gpu"]
    assert RELEASE[run]["all_as_expected"] is True
    for case in RELEASE[run]["cases"]:
        hog = case["hog"]
        assert hog["said"] == "hog holds %d" % hog["hold_bytes"] and hog["exit"] == 0 and hog["hold_s"] == 30
        assert case["used_before_mib"] * MIB >= hog["hold_bytes"]  # the card held when the launch started


@pytest.mark.parametrize("run", sorted(RELEASE))
def test_a_stopping_engines_memory_fails_vllms_own_check(run):
    loader = _loader()
    case = _release(run, "release-direct")
    facts = case["stand_in_facts"]
    assert case["config_extra"] == {"admission": False}
    assert facts["free_at_check"] < case["hog"]["free_mib_with_hog"] * MIB  # the other process's memory held
    with pytest.raises(loader.LoaderError, match="less than desired GPU memory utilization"):
        loader.startup_check(facts["free_at_check"], facts["total_at_check"], case["gmu"])
    assert not case["healthy"] and case["exit_code"] == 1 and case.get("admission") is None


@pytest.mark.parametrize("run", sorted(RELEASE))
def test_the_gpu_admission_waits_for_a_stopping_engines_memory_and_the_engine_serves(run):
    case = _release(run, "release-gpu")
    adm = case["admission"]
    budget = RELEASE[run]["plans"]["launch"]["budget"]
    need, _source = _admission.gpu_need({"plan": budget, "admission_request_bytes": None, "env": {}})
    assert adm["need_bytes"] == need == budget["requested_memory_bytes"] + budget["cuda_context_bytes"]
    # held at the start (free with the hog < need), admitted once it was let go: the wait is the hold
    assert case["hog"]["free_mib_with_hog"] * MIB < need
    assert adm["admitted"] is True and all(gpu["free_bytes"] >= need for gpu in adm["gpus"])
    assert 25.0 <= adm["waited_s"] <= case["hog"]["hold_s"] + 5.0
    assert case["healthy"] and case["completion_ok"] and case["exit_code"] == 0 and case["used_after_mib"] == 0
    assert case["to_healthy_s"] > adm["waited_s"]
    facts = case["stand_in_facts"]
    assert facts["free_at_check"] >= facts["requested_at_check"] == math.ceil(facts["total_at_check"] * case["gmu"])
