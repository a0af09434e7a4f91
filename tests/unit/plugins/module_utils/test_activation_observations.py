# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner's activation reserve against public vLLM memory profiles (issue 14 item 5).

Rows: tests/unit/fixtures/models/activation_observations.yaml (each with its URL). What is
compared is the part vLLM's profile run subtracts from its budget: the planner's
forward/sampler peak + non-torch memory against the logged "PyTorch activation peak memory"
+ "non_torch_memory". The issue's bar: estimate >= observed and at most +30%.

Constants were chosen on the rows marked ``fit`` (llama3-8b-tp1-h100, mistral-small-24b-h100,
qwen25-7b-awq-rtx4060, gpt-oss-20b-a100) and on vLLM's sampler sources; the ``holdout`` rows
were not looked at while choosing them. gpt-oss-20b-a100 logs no breakdown: activation +
non-torch is derived (0.65 x total - weights - KV) as a range, the A100's total not being logged.
Per-log ratios are pinned (abs 0.02): a change of the estimate fails here.

Where the bar is not met, and why:
- r1-distill-qwen-14b-tp2-rtx4090: the logged line is a TP worker that does not sample
  (V0 samples on rank 0 only); the planner reserves for the rank that samples (4.31 x that
  worker's figure). Against that worker's own share (forward + non-torch) it is 1.13.
- llama32-11b-vision-h100: 36.6 GiB of the profile is the vision model's; the planner does not
  model encoders (0.25 x), warns and asks for activation_reserve_gib.
- CUDA graphs: 1 GiB flat against the two logs that show them (0.49 GiB; -0.76 GiB): never
  below, not within +30% (2.04 x on the 0.49 GiB log).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod

GIB = float(1 << 30)
MODELS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "models"
ROWS = yaml.safe_load((MODELS / "activation_observations.yaml").read_text())
PROFILED = [r for r in ROWS if r["observed"]["activation"] is not None]


def plan_row(row):
    config = row.get("model_config") or json.loads((MODELS / row["fixture"] / "config.json").read_text())
    params = dict(row["params"], model="m", model_config=config, kv_cache_memory_bytes=20 << 30)
    params["vllm_version"] = row["vllm_version"]
    return plan_mod.plan(params)


def estimate(row):
    return {k: v / GIB for k, v in plan_row(row)["budget"]["activation_parts"].items()}


def observed(row):
    obs = row["observed"]
    return obs["activation"] + obs["non_torch"]


def test_the_fixture_is_what_the_note_says():
    assert len(PROFILED) == 7
    assert {r["id"] for r in ROWS if r["set"] == "fit"} == {
        "llama3-8b-tp1-h100",
        "mistral-small-24b-h100",
        "qwen25-7b-awq-rtx4060",
        "gpt-oss-20b-a100",
    }
    for row in ROWS:
        assert row["url"]
        assert row["set"] in ("fit", "holdout") and row["scope"] in ("text", "multimodal")


# The logs that show every term of vLLM's budget (the others are checked by their ratio only).
BALANCED = [r for r in ROWS if None not in (r["observed"]["kv"], r["observed"]["activation"], r["observed"]["total"])]


def test_which_logs_show_every_term():
    assert len(BALANCED) == len(ROWS) - 3, [r["id"] for r in ROWS if r not in BALANCED]


@pytest.mark.parametrize("row", BALANCED, ids=[r["id"] for r in BALANCED])
def test_the_logs_books_balance(row):
    obs = row["observed"]
    used = obs["weights"] + obs["activation"] + obs["non_torch"] + obs["kv"]
    assert abs(used - obs["total"] * obs["gmu"]) < 0.01 * obs["total"] + 0.05


# estimate / observed (forward or sampler peak + non-torch vs activation + non-torch)
RATIO = {
    "llama3-8b-tp1-h100": 1.03,  # fit
    "llama3-8b-tp2-h100": 1.02,  # holdout
    "qwen25-32b-tp2-l40s": 1.09,  # holdout
    "mistral-small-24b-h100": 1.04,  # fit (forward sets the peak)
    "qwen25-7b-awq-rtx4060": 1.20,  # fit
    "r1-distill-qwen-14b-tp2-rtx4090": 4.31,  # holdout, a non-sampling rank's line
    "llama32-11b-vision-h100": 0.25,  # holdout, multimodal: not modelled
}


@pytest.mark.parametrize("row", PROFILED, ids=[r["id"] for r in PROFILED])
def test_profile_part_against_the_log(row):
    est = estimate(row)
    ratio = (est["forward"] + est["sampler"] + est["non_torch"]) / observed(row)
    assert ratio == pytest.approx(RATIO[row["id"]], abs=0.02)


@pytest.mark.parametrize(
    "row", [r for r in PROFILED if r["scope"] == "text"], ids=[r["id"] for r in PROFILED if r["scope"] == "text"]
)
def test_the_issue_bar_on_every_text_model_log(row):
    """>= observed and <= +30%; for a non-sampling rank's line, that rank's own share."""
    est = estimate(row)
    if row["rank"] == "other":
        # forward + non-torch of that rank: the planner's forward figure is kept when the
        # sampler sets the peak, recomputed here from the same per-token formula
        parts = plan_row(dict(row, params=dict(row["params"], max_num_seqs=1)))["budget"]["activation_parts"]
        share = (parts["forward"] + parts["non_torch"]) / GIB
        assert share / observed(row) == pytest.approx(1.13, abs=0.02)
    else:
        share = est["forward"] + est["sampler"] + est["non_torch"]
    assert observed(row) <= share <= 1.3 * observed(row), row["id"]


def test_multimodal_log_is_below_and_the_planner_says_so():
    row = next(r for r in ROWS if r["scope"] == "multimodal")
    result = plan_row(row)
    assert sum(result["budget"]["activation_parts"].values()) / GIB < observed(row)
    assert any("activation_reserve_gib" in w and "vision_config" in w for w in result["warnings"])
    params = dict(row["params"], model="m", model_config=row["model_config"], kv_cache_memory_bytes=20 << 30)
    params.update(vllm_version=row["vllm_version"], activation_reserve_gib=37)
    given = plan_mod.plan(params)
    assert not any("vision_config" in w for w in given["warnings"])
    assert given["budget"]["activation_reserve_bytes"] == 37 << 30


def test_cuda_graph_term_is_never_below_a_logged_capture():
    logged = [r for r in ROWS if r["observed"]["cudagraph"] is not None and r["observed"]["cudagraph"] > 0]
    assert [r["id"] for r in logged] == ["qwen25-1.5b-rtx2000ada"]
    for row in logged:
        est = estimate(row)
        assert est["cuda_graphs"] >= row["observed"]["cudagraph"]
        assert est["cuda_graphs"] / row["observed"]["cudagraph"] == pytest.approx(2.04, abs=0.02)


def test_held_out_rows_inside_the_bar():
    """The held-out text rows that show the sampling rank: within the bar without refitting."""
    held = [r for r in PROFILED if r["set"] == "holdout" and r["scope"] == "text" and r["rank"] != "other"]
    assert [r["id"] for r in held] == ["llama3-8b-tp2-h100", "qwen25-32b-tp2-l40s"]
    for row in held:
        est = estimate(row)
        share = est["forward"] + est["sampler"] + est["non_torch"]
        assert observed(row) <= share <= 1.3 * observed(row)


def test_derived_row_inside_the_bar_over_its_whole_range():
    """gpt-oss-20b on 0.19.0: >= the upper end and <= +30% of the lower end."""
    row = next(r for r in ROWS if r["id"] == "gpt-oss-20b-a100")
    low, high = row["observed"]["derived_range"]
    obs = row["observed"]
    for total in (79.15, 79.25):
        derived = obs["gmu"] * total - obs["weights"] - obs["kv"]
        assert low - 0.01 <= derived <= high + 0.01
    est = estimate(row)
    share = est["forward"] + est["sampler"] + est["non_torch"]
    assert high <= share <= 1.3 * low
    assert share / high == pytest.approx(1.06, abs=0.02)
