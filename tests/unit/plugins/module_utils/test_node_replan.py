# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 14 item 3: does planning the engines of a node together change anything?

The role plans each engine alone (its reserve derived for an empty node) and then checks
the set with _node_budget. Planning together would plan each engine knowing the others:
``other_engines_gib`` = the others' footprints, which the MemAvailable model subtracts.
Checked here on real plans (fixture configs, 119.7 and 128 GiB unified-memory nodes):
- a set the node check accepts: every engine's argv planned together is identical to the
  one planned alone (same KV budget, same --gpu-memory-utilization), so re-planning
  would emit nothing different;
- a set the node check refuses: planned together, at least one engine is refused by
  vllm_flags or gets a KV cache below its max_num_seqs x max_model_len (the "fit" budget
  shrinks to the room the others leave: a silent loss of concurrency), so a refusal that
  names the engine to shrink is the better answer than re-planning.
Exception, by design: kv_budget "max" takes all the room of an empty node, so such an
engine never fits beside another (the node check refuses it and names it); dividing the
node between "max" engines is a policy the role does not have.
"""

from __future__ import annotations

import itertools
import json
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod
from ansible_collections.uma.vllm.plugins.module_utils.plan.node_budget import plan_node

GIB = float(1 << 30)
MODELS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "models"


def cfg(name):
    return json.loads((MODELS / name / "config.json").read_text())


def _engine(model, weights_bytes, max_model_len, max_num_seqs):
    return dict(
        model_config=cfg(model), weights_bytes=weights_bytes, max_model_len=max_model_len, max_num_seqs=max_num_seqs
    )


# name: (model fixture, weights bytes, max_model_len, max_num_seqs)
ENGINES = {
    name: _engine(*row)
    for name, row in {
        "llama8b-64x8k": ("llama-3-8b", 16060522496, 8192, 64),
        "llama8b-256x8k": ("llama-3-8b", 16060522496, 8192, 256),
        "llama8b-16x8k": ("llama-3-8b", 16060522496, 8192, 16),
        "gptoss20b-8x16k": ("gpt-oss-20b", 13761264768, 16384, 8),
        "qwen1.5b-16x32k": ("qwen2.5-1.5b-instruct", 3087467520, 32768, 16),
        "qwen3-32b-8x32k": ("qwen3-32b", 65527752704, 32768, 8),
        "gptoss20b-32x64k": ("gpt-oss-20b", 13761264768, 65536, 32),
    }.items()
}


def plan(name, total, others_bytes=0):
    params = dict(ENGINES[name], model="m", total_memory_gib=total)
    if others_bytes:
        params["other_engines_gib"] = others_bytes / GIB
    return plan_mod.plan(params)


SETS = [
    (total, combo)
    for total in (119.7, 128.0)
    for size in (2, 3)
    for combo in itertools.combinations(sorted(ENGINES), size)
]


@pytest.mark.parametrize("total,combo", SETS, ids=["%s-%s" % (t, "+".join(c)) for t, c in SETS])
def test_planning_together_changes_nothing_the_node_check_accepts(total, combo):
    alone = {name: plan(name, total) for name in combo}
    node = plan_node("n", [{"name": n, "budget": alone[n]["budget"]} for n in combo])
    together = {}
    for name in combo:
        others = sum(r["footprint_bytes"] for r in node["engines"] if r["engine"] != name)
        try:
            together[name] = plan(name, total, others)
        except UmaError:
            together[name] = None
    if not node["errors"]:
        for name in combo:
            assert together[name] is not None, name
            assert together[name]["argv"] == alone[name]["argv"], name
            assert together[name]["budget"]["kv_cache_bytes"] == alone[name]["budget"]["kv_cache_bytes"]
    else:
        # planned together, an engine is refused or gets less KV cache than its
        # max_num_seqs x max_model_len (vllm_flags' "fit" budget shrinks to the room left):
        # the asked concurrency cannot be kept, so refusing the set is the right answer
        short = []
        for name in combo:
            if together[name] is None:
                short.append(name)
                continue
            budget = together[name]["budget"]
            if budget["kv_cache_bytes"] < alone[name]["budget"]["kv_cache_bytes"]:
                assert budget["max_concurrency"] < ENGINES[name]["max_num_seqs"], name
                short.append(name)
        assert short, node["errors"]


def test_the_sets_cover_both_outcomes():
    outcomes = set()
    for total, combo in SETS:
        alone = [{"name": n, "budget": plan(n, total)["budget"]} for n in combo]
        outcomes.add(not plan_node("n", alone)["errors"])
    assert outcomes == {True, False}
