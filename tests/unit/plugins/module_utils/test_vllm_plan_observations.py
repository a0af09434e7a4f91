"""The planner against real vLLM logs (shared/data/kv_observations.json).

Each row gives the KV budget vLLM logged ("Available KV cache memory", rounded
to 2 decimals); planned with exactly that budget, ``kv_tokens`` must be within
1% of the logged "GPU KV cache size" (2% for hybrid models), and a row that
logged an out-of-memory refusal must be refused with the same "needed" figure.
Rows are read from the shared data file when it is beside the checkout (more
rows may be added there) and from the copy in the fixtures otherwise. Each row
is planned twice: with the fixture config.json of its model when there is one,
and with the row's own model_config summary.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod

ROOT = pathlib.Path(__file__).parents[4]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "models"
SHARED = ROOT.parent / "shared" / "data" / "kv_observations.json"
GIB = 1 << 30

FIXTURE_OF = {
    "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b-instruct",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "mistralai/Mistral-Small-3.2-24B-Instruct-2506": "mistral-small-3.2-24b-instruct-2506",
    "deepseek-ai/DeepSeek-V2-Lite(-Chat)": "deepseek-v2-lite",
    "Qwen/Qwen3.5-0.8B": "qwen3.5-0.8b",
}


def rows():
    path = SHARED if SHARED.exists() else FIXTURES / "kv_observations.json"
    return json.loads(path.read_text())


def is_hybrid(row):
    text = json.dumps(row.get("model_config", {})).lower()
    return any(word in text for word in ("linear", "gateddeltanet", "mamba"))


def _load_benchmark():
    """benchmarks/planner_accuracy.py: its row -> planner parameters is the one under test here too."""
    spec = importlib.util.spec_from_file_location("planner_accuracy", ROOT / "benchmarks" / "planner_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCHMARK = _load_benchmark()


def row_params(row, use_fixture):
    params = BENCHMARK.params_of(row)
    fixture = FIXTURE_OF.get(row["model"])
    if use_fixture and fixture:
        params["model_config"] = json.loads((FIXTURES / fixture / "config.json").read_text())
    return params


CASES = [
    pytest.param(row, use_fixture, id="%s-%s" % (row["id"], "config.json" if use_fixture else "summary"))
    for row in rows()
    for use_fixture in (True, False)
    if use_fixture is False or row["model"] in FIXTURE_OF
]


@pytest.mark.parametrize("row,use_fixture", CASES)
def test_observation(row, use_fixture):
    observed = row["observed"]
    params = row_params(row, use_fixture)
    if observed.get("kv_tokens") is None:
        # a logged refusal: reproduce vLLM's "needed" figure
        with pytest.raises(plan_mod.PlanRefused) as err:
            plan_mod.plan(params)
        details = err.value.details
        assert details["kv_needed_gib_logged"] == "%.2f" % observed["kv_needed_gib_for_max_model_len"]
        assert "%.2f GiB KV cache is needed" % observed["kv_needed_gib_for_max_model_len"] in err.value.message
        assert 0 < details["estimated_max_model_len"] < row["max_model_len"]
        return
    budget = plan_mod.plan(params)["budget"]
    tolerance = 0.02 if is_hybrid(row) else 0.01
    error = abs(budget["kv_tokens"] - observed["kv_tokens"]) / float(observed["kv_tokens"])
    assert error <= tolerance, "%s: predicted %d, logged %d (%.3f%%)" % (
        row["id"],
        budget["kv_tokens"],
        observed["kv_tokens"],
        100 * error,
    )
    if observed.get("max_concurrency") is not None:
        assert abs(budget["max_concurrency"] - observed["max_concurrency"]) / observed["max_concurrency"] <= tolerance
    if observed.get("block_size") is None and observed.get("log_extra", "").startswith("Setting attention block size"):
        assert str(budget["block_size"]) in observed["log_extra"]


def test_the_shared_rows_are_all_planned():
    # a guard that the parametrisation above really ran over the data file
    assert len(rows()) >= 5 and len(CASES) >= len(rows())
