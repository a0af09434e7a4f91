# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory-budget planner against real vLLM start-up logs: prints a table.

Each row of ``kv_observations.json`` (../shared/data beside the checkout, else
the copy in the unit-test fixtures) is planned with the KV budget vLLM logged
("Available KV cache memory"); the table shows the KV tokens vLLM logged, the
tokens the planner predicts and the error, or for a row where vLLM refused to
start, the "needed" figure both give. The unit test
``tests/unit/plugins/module_utils/test_vllm_plan_observations.py`` asserts the
same rows within 1% (2% for hybrid models); this prints the numbers.

    PYTHONPATH=.cache/collections .venv/bin/python benchmarks/planner_accuracy.py [--json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "kv_observations.json"
FIXTURE = ROOT / "tests" / "unit" / "fixtures" / "models" / "kv_observations.json"
GIB = 1 << 30


def load_plan_module():
    from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as _vllm_plan

    return _vllm_plan


def params_of(row: dict) -> dict:
    observed = row["observed"]
    params = {
        "model": row["model"],
        "kv_cache_memory_bytes": int(observed["available_kv_gib"] * GIB),
        "tensor_parallel_size": row.get("tp") or 1,
        "pipeline_parallel_size": row.get("pp") or 1,
        "max_model_len": row["max_model_len"],
        "kv_cache_dtype": row.get("kv_cache_dtype") or "auto",
        "block_size": observed.get("block_size"),
        "model_config": row["model_config"],
    }
    for key in ("vllm_version", "dtype"):
        if row.get(key):
            params[key] = row[key]
    return params


def evaluate(rows: list, plan_mod) -> list:
    out = []
    for row in rows:
        observed = row["observed"]
        item = {
            "id": row["id"],
            "model": row["model"],
            "tp": row.get("tp") or 1,
            "vllm": row.get("vllm_version"),
            "budget_gib": observed["available_kv_gib"],
            "logged_tokens": observed.get("kv_tokens"),
        }
        try:
            item["planned_tokens"] = plan_mod.plan(params_of(row))["budget"]["kv_tokens"]
        except plan_mod.PlanRefused as err:
            item["planned_tokens"] = None
            item["refused_needed_gib"] = err.details.get("kv_needed_gib_logged")
            item["estimated_max_model_len"] = err.details.get("estimated_max_model_len")
        if item["logged_tokens"] and item["planned_tokens"]:
            delta = item["planned_tokens"] - item["logged_tokens"]
            item["error_pct"] = round(100.0 * delta / item["logged_tokens"], 3)
        item["logged_needed_gib"] = observed.get("kv_needed_gib_for_max_model_len")
        out.append(item)
    return out


def table(items: list) -> str:
    lines = [
        "| row | model | TP | vLLM | KV budget GiB | logged KV tokens | planned KV tokens | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for it in items:
        if it["planned_tokens"] is None:
            needed = it["logged_needed_gib"]
            planned = "refused: needs %s GiB (est. max len %s)" % (
                it["refused_needed_gib"],
                it["estimated_max_model_len"],
            )
            logged = "refused: needs %.2f GiB" % needed if needed else "-"
            error = "same figure" if needed and it["refused_needed_gib"] == "%.2f" % needed else "DIFFERS"
        else:
            planned = "{:,}".format(it["planned_tokens"])
            logged = "{:,}".format(it["logged_tokens"]) if it["logged_tokens"] else "-"
            error = "%+.2f%%" % it["error_pct"] if "error_pct" in it else "-"
        lines.append(
            "| %s | %s | %s | %s | %.2f | %s | %s | %s |"
            % (it["id"], it["model"], it["tp"], it["vllm"] or "-", it["budget_gib"], logged, planned, error)
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=SHARED if SHARED.exists() else FIXTURE)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ns = parser.parse_args()
    items = evaluate(json.loads(ns.data.read_text()), load_plan_module())
    if ns.json:
        print(json.dumps({"data": str(ns.data), "rows": items}, indent=1))
    else:
        print("data: %s" % ns.data)
        print(table(items))
        errors = [abs(it["error_pct"]) for it in items if "error_pct" in it]
        if errors:
            print("largest |error|: %.3f%% over %d rows with a logged KV size" % (max(errors), len(errors)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
