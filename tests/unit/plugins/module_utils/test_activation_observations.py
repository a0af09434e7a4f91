# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner's activation reserve against public vLLM memory profiles (issue 14 item 5).

Asserted: each log's own books balance (weights + activation + non-torch + KV = total x
utilization). The issue's bar (estimate >= observed and within +30%) is NOT met; the
ratios as they stand are pinned so that any change to the estimate shows here:
- torch part (one forward pass of max_num_batched_tokens + sampler logits) / logged
  activation peak: 0.99, 0.69 (TP 2: vLLM's peak did not halve with TP, the estimate
  does), 1.20, 1.37;
- whole reserve (+ 1 GiB graphs + 0.5 GiB non-torch) / logged activation + non-torch
  (+ graphs): 0.90 and 0.49 on the Llama rows (V0 logged 1.79 / 3.58 GiB non-torch
  memory on H100), 1.93 and 1.95 on the other two.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils import _vllm_plan as plan_mod

GIB = float(1 << 30)
MODELS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "models"
ROWS = yaml.safe_load((MODELS / "activation_observations.yaml").read_text())


def estimate(row):
    config = row.get("model_config") or json.loads((MODELS / row["fixture"] / "config.json").read_text())
    params = dict(row["params"], model="m", model_config=config, kv_cache_memory_bytes=16 << 30)
    params["vllm_version"] = row["vllm_version"]
    parts = plan_mod.plan(params)["budget"]["activation_parts"]
    return {k: v / GIB for k, v in parts.items()}


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_the_logs_books_balance(row):
    obs = row["observed"]
    if obs["kv"] is None:
        pytest.skip("no KV figure in this log")
    used = obs["weights"] + obs["activation"] + obs["non_torch"] + max(obs["cudagraph"] or 0, 0) + obs["kv"]
    assert abs(used - obs["total"] * obs["gmu"]) < 0.05 * obs["total"]


KNOWN_TORCH_RATIO = {
    "llama3-8b-tp1-h100": 0.99,
    "llama3-8b-tp2-h100": 0.69,
    "qwen25-32b-tp2-l40s": 1.20,
    "mistral-small-24b-h100": 1.37,
}


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_torch_part_against_the_logged_activation_peak_as_it_stands(row):
    est = estimate(row)
    ratio = (est["forward"] + est["logits"]) / row["observed"]["activation"]
    assert ratio == pytest.approx(KNOWN_TORCH_RATIO[row["id"]], abs=0.02)


# total estimate / observed (activation + non-torch + graphs when logged and positive), today
KNOWN_TOTAL_RATIO = {
    "llama3-8b-tp1-h100": 0.90,
    "llama3-8b-tp2-h100": 0.49,
    "qwen25-32b-tp2-l40s": 1.93,
    "mistral-small-24b-h100": 1.95,
}


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_whole_estimate_against_the_logs_as_it_stands(row):
    est = estimate(row)
    obs = row["observed"]
    observed = obs["activation"] + obs["non_torch"] + max(obs["cudagraph"] or 0, 0)
    ratio = sum(est.values()) / observed
    assert ratio == pytest.approx(KNOWN_TOTAL_RATIO[row["id"]], abs=0.02)
