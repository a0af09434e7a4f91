# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan contract (issue 36 item 3): node/base/plan.py ``StartPlan`` is the one reading of the memory plan
on its way from the planner (plan/budget.py) through the node budget (plan/node_budget.py) to the launcher's
admission (node/launch/admission.py): one definition, its constants in one place, checked on each side."""

from __future__ import annotations

import ast
import json
import pathlib

import node_helpers
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import plan as contract
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import admission
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner
from ansible_collections.uma.vllm.plugins.module_utils.plan.node_budget import engine_row, plan_node

GIB = 1 << 30
ROOT = pathlib.Path(__file__).resolve().parents[4]
MODULE_UTILS = ROOT / "plugins" / "module_utils"
MODELS = ROOT / "tests" / "unit" / "fixtures" / "models"
LLAMA8B = json.loads((MODELS / "llama-3-8b" / "config.json").read_text())
MEMINFO = "MemTotal: 125829120 kB\nMemFree: 1024 kB\nMemAvailable: 104857600 kB\n"


def budget(**extra):
    params = dict(model="m", model_config=LLAMA8B, weights_bytes=16060522496, total_memory_gib=119.7,
                  max_model_len=8192, max_num_seqs=8)  # fmt: skip
    params.update(extra)
    return planner.plan(params)["budget"]


@pytest.mark.parametrize(
    "extra",
    [{}, {"tensor_parallel_size": 2}, {"unified_memory": False}, {"unified_memory": False, "tensor_parallel_size": 2},
     {"unified_memory": False, "env": {"CUDA_MODULE_LOADING": "EAGER"}},
     {"total_memory_gib": None, "kv_cache_memory_bytes": 4 * GIB}],
    ids=["unified", "unified-tp2", "discrete", "discrete-tp2", "discrete-eager", "no-total"],
)  # fmt: skip
def test_one_start_request_from_planner_to_node_budget_to_launcher(tmp_path, extra):
    """The figure the node budget sums for an engine's start and the one the launcher's host admission asks
    MemAvailable for come from one method of the contract, on the plan the planner emitted."""
    emitted = budget(**extra)
    plan = contract.StartPlan.read(emitted)
    for key in contract.BYTES_KEYS + contract.COUNT_KEYS + ("unified_memory",):
        assert getattr(plan, key) == emitted[key], key
    config = node_helpers.launch_config(tmp_path, MEMINFO, plan=emitted)
    assert config["_plan"] == plan  # the launcher's validator read it once, into the typed plan
    need, source = admission.host_need(config)
    row = engine_row("e", plan)
    if emitted["requested_memory_bytes"] is None:
        assert need is None and source == "no startup request in the plan"
        assert row["start_request_bytes"] == row["footprint_bytes"]
    else:
        assert need == emitted["requested_memory_bytes"] * emitted["ranks_per_node"]
        assert row["start_request_bytes"] == max(need, row["footprint_bytes"])
        assert source == "plan requested_memory_bytes x %d rank(s)" % emitted["ranks_per_node"]


def test_the_gpu_need_adds_the_contracts_context():
    discrete = contract.StartPlan.read(budget(unified_memory=False))
    assert discrete.cuda_context_bytes == contract.CUDA_CONTEXT_BYTES
    assert discrete.gpu_need({})[0] == discrete.requested_memory_bytes + contract.CUDA_CONTEXT_BYTES
    eager = {"CUDA_MODULE_LOADING": "eager"}
    assert discrete.gpu_need(eager)[0] == discrete.requested_memory_bytes + contract.CUDA_CONTEXT_EAGER_BYTES
    assert contract.StartPlan.read(budget(unified_memory=False, env=eager)).cuda_context_bytes == (
        contract.CUDA_CONTEXT_EAGER_BYTES)  # fmt: skip
    assert contract.StartPlan.read(budget()).admission_memory()[0] == "host"
    assert discrete.admission_memory()[0] == "gpu"


@pytest.mark.parametrize(
    "key, value, rule",
    [("requested_memory_bytes", 1e308, "is not a number of bytes from 0 to 1 PiB"),
     ("kv_cache_bytes", -1, "is not a number of bytes from 0 to 1 PiB"),
     ("total_memory_bytes", "119 GiB", "is not a number of bytes from 0 to 1 PiB"),
     ("ranks_per_node", 0, "is not a whole number from 1 to 1024"),
     ("gpus_per_node", 2.0, "is not a whole number from 1 to 1024"),
     ("unified_memory", "yes", "is not true, false or null"),
     ("reserve_source", 7, "is not text or null")],
)  # fmt: skip
def test_a_budget_outside_the_contract_is_named_by_the_node_budget(key, value, rule):
    """The node budget reads each engine's plan through the contract: a damaged one is an error naming the
    host, the engine and the key (the role's assert shows it before anything changes), never a traceback
    and never a silent 0 in the sum (before: any value that was not a number was taken as 0 or 1)."""
    good = budget()
    bad = dict(good, **{key: value})
    result = plan_node("ai1", [{"name": "ok", "budget": good}, {"name": "hurt", "budget": bad}])
    assert len(result["errors"]) == 1
    message = result["errors"][0]
    assert message.startswith("ai1: engine hurt: its plan option 'plan.%s' = " % key) and rule in message
    assert [r["engine"] for r in result["engines"]] == ["ok"]


def test_the_launcher_refuses_what_the_contract_refuses(tmp_path):
    with pytest.raises(UmaError) as err:
        node_helpers.launch_config(tmp_path, MEMINFO, plan=dict(budget(), ranks_per_node=True))
    assert err.value.option == "plan.ranks_per_node" and "nothing was started" in err.value.message


def _code_strings(path):
    """The string constants of a file's code: docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]  # fmt: skip


def test_the_node_reads_the_plans_keys_only_in_the_contract():
    """No node program looks a plan key up by itself (the 14 ``get("plan")`` + isinstance guards of issue 36):
    outside node/base/plan.py no code of the node package names one (unified_memory and reserve_bytes are also
    keys of the watchdog's config and of memavail's startup model, records of their own: left out here)."""
    keys = set(contract.KEYS) - {"unified_memory", "reserve_bytes"}
    found = {}
    for path in sorted((MODULE_UTILS / "node").rglob("*.py")):
        if path.name == "plan.py" and path.parent.name == "base":
            continue
        named = keys.intersection(_code_strings(path))
        if named:
            found[str(path.relative_to(ROOT))] = sorted(named)
    assert found == {}


def test_the_cuda_context_figures_are_defined_once():
    homes = {}
    for path in sorted(MODULE_UTILS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id.startswith("CUDA_CONTEXT"):
                    homes.setdefault(target.id, []).append(str(path.relative_to(MODULE_UTILS)))
    assert homes == {"CUDA_CONTEXT_BYTES": ["node/base/plan.py"], "CUDA_CONTEXT_EAGER_BYTES": ["node/base/plan.py"]}
