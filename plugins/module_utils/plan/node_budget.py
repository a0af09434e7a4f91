# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every engine of a node budgeted together (issue 14 item 3).

Each engine is planned by ``plan/planner.py`` on its own; this puts the plans of one
node side by side. On unified memory the engines share the node's memory, and the
launch lock lets them load in any order, so each engine's start must pass vLLM's
startup check with every other engine already loaded::

    for each started engine e:
        start request(e) + sum of footprints(others) <= expected MemAvailable at start

with ``start request = ranks on the node x ceil(total x gpu_memory_utilization)``,
``footprint = ranks on the node x (weights + activation reserve + KV cache) per rank``
(both the plan contract's, ``node/base/plan.py`` ``StartPlan``: the launcher's host admission asks the
node for the same start request) and the node's room, ``total - reserve`` of the plans (a derived reserve
makes it the expected MemAvailable at start, ``node/base/memavail.py``). When a set does
not fit, shrinking the largest engine by the largest shortfall makes every start fit:
that engine and that amount are named.

Pure stdlib; imports under Python 3.8.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.base.plan import StartPlan

GIB = float(1 << 30)


def engine_row(name: str, plan: StartPlan) -> Dict[str, Any]:
    """What one engine's plan takes from the node (the plan contract's footprint and start request)."""
    ranks = plan.ranks
    return {
        "engine": name,
        "ranks": ranks,
        "weights_bytes": ranks * (plan.weights_per_rank_bytes or 0),
        "activation_bytes": ranks * (plan.activation_reserve_bytes or 0),
        "kv_cache_bytes": ranks * (plan.kv_cache_bytes or 0),
        "footprint_bytes": plan.footprint_bytes(),
        "start_request_bytes": plan.start_request_bytes(),
    }


def node_available(plans: List[StartPlan]) -> Dict[str, Any]:
    """What the engines may use together: total - reserve of the plans (the smallest if they
    differ). A derived reserve makes that the expected MemAvailable at start (_memavail);
    a given reserve_gib is the operator's word."""
    room = [(p.total_memory_bytes - (p.reserve_bytes or 0), p.reserve_source) for p in plans
            if p.total_memory_bytes is not None]  # fmt: skip
    if not room:
        return {"available_bytes": None, "source": "no total_memory_gib in the plans"}
    available, source = min(room)
    if source.startswith("derived"):
        return {"available_bytes": available, "source": "expected MemAvailable at start"}
    return {"available_bytes": available, "source": "total - reserve_gib"}


def plan_node(host: str, engines: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``engines``: [{"name", "budget", "started"}]. Returns rows, the node's numbers,
    ``errors`` (empty when the set fits; a budget outside the plan contract is one, naming the engine)
    and a table for people."""
    errors: List[str] = []
    plans: List[Tuple[str, StartPlan]] = []
    for engine in engines:
        if not engine.get("started", True) or not isinstance(engine.get("budget"), dict):
            continue
        try:
            plans.append((engine["name"], StartPlan.read(engine["budget"])))
        except UmaError as err:
            errors.append("%s: engine %s: its plan %s" % (host, engine["name"], err.message))
    rows = [engine_row(name, plan) for name, plan in plans]
    node = node_available([plan for _name, plan in plans])
    total = max((plan.total_memory_bytes or 0 for _name, plan in plans), default=0) or None
    available = node["available_bytes"]
    worst = None
    if available is not None:
        all_footprints = sum(r["footprint_bytes"] for r in rows)
        for row in rows:
            others = all_footprints - row["footprint_bytes"]
            row["others_bytes"] = others
            row["needs_free_bytes"] = row["start_request_bytes"] + others
            row["short_bytes"] = max(0, row["needs_free_bytes"] - available)
            if row["short_bytes"] and (worst is None or row["short_bytes"] > worst["short_bytes"]):
                worst = row
    if worst is not None:
        largest = max(rows, key=lambda r: (r["footprint_bytes"], r is worst))
        errors.append(
            "%s: the started engines do not fit together: engine %s, starting with the others loaded (%.2f GiB), "
            "asks vLLM's startup check for %.2f GiB, %.2f GiB in all, but the node's %s is %.2f GiB "
            "(short by %.2f GiB). Fix: shrink engine %s (footprint %.2f GiB, KV cache %.2f GiB) by at least "
            "%.2f GiB - lower its max_model_len / max_num_seqs or use kv_cache_dtype fp8 - or set an engine's "
            "state to stopped or move it to another node."
            % (
                host,
                worst["engine"],
                worst["others_bytes"] / GIB,
                worst["start_request_bytes"] / GIB,
                worst["needs_free_bytes"] / GIB,
                node["source"],
                available / GIB,
                worst["short_bytes"] / GIB,
                largest["engine"],
                largest["footprint_bytes"] / GIB,
                largest["kv_cache_bytes"] / GIB,
                worst["short_bytes"] / GIB,
            )
        )
    result = {
        "host": host,
        "engines": rows,
        "total_memory_bytes": total,
        "available_bytes": available,
        "available_source": node["source"],
        "footprint_bytes": sum(r["footprint_bytes"] for r in rows),
        "errors": errors,
    }
    result["table"] = table(result)
    return result


def table(result: Dict[str, Any]) -> str:
    def g(value: Optional[int]) -> str:
        return "-" if value is None else "%.2f" % (value / GIB)

    lines = [
        "node %s: %d started engine(s), total %s GiB, %s %s GiB"
        % (
            result["host"],
            len(result["engines"]),
            g(result["total_memory_bytes"]),
            result["available_source"],
            g(result["available_bytes"]),
        ),
        "  %-20s %5s %9s %9s %9s %10s %10s %10s" % ("engine", "ranks", "weights", "activ.", "KV", "footprint",
                                                    "start req", "needs free"),
    ]  # fmt: skip
    for row in result["engines"]:
        lines.append(
            "  %-20s %5d %9s %9s %9s %10s %10s %10s"
            % (
                row["engine"][:20],
                row["ranks"],
                g(row["weights_bytes"]),
                g(row["activation_bytes"]),
                g(row["kv_cache_bytes"]),
                g(row["footprint_bytes"]),
                g(row["start_request_bytes"]),
                g(row.get("needs_free_bytes")),
            )
        )
    if result["available_bytes"] is not None:
        lines.append(
            "  all engines loaded: %s GiB of %s GiB; headroom %s GiB"
            % (
                g(result["footprint_bytes"]),
                g(result["available_bytes"]),
                g(result["available_bytes"] - result["footprint_bytes"]),
            )
        )
    lines.extend("  REFUSED: " + e for e in result["errors"])
    return "\n".join(lines)
