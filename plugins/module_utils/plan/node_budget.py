# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every engine of a node budgeted together (issue 14 item 3).

Each engine is planned by ``_vllm_plan.plan`` on its own; this puts the plans of one
node side by side. On unified memory the engines share the node's memory, and the
launch lock lets them load in any order, so each engine's start must pass vLLM's
startup check with every other engine already loaded::

    for each started engine e:
        start request(e) + sum of footprints(others) <= expected MemAvailable at start

with ``start request = ranks on the node x ceil(total x gpu_memory_utilization)``,
``footprint = ranks on the node x (weights + activation reserve + KV cache) per rank``
and the expected MemAvailable from ``_memavail`` (what the plans carry as
``expected_available_bytes``; ``total - reserve`` when a plan has none). When a set does
not fit, shrinking the largest engine by the largest shortfall makes every start fit:
that engine and that amount are named.

Pure stdlib; imports under Python 3.8.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

GIB = float(1 << 30)


def _int(budget: Dict[str, Any], key: str) -> Optional[int]:
    value = budget.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def engine_row(name: str, budget: Dict[str, Any]) -> Dict[str, Any]:
    """What one engine's plan takes from the node."""
    ranks = _int(budget, "ranks_per_node") or 1
    per_rank = sum(
        _int(budget, key) or 0 for key in ("weights_per_rank_bytes", "activation_reserve_bytes", "kv_cache_bytes")
    )
    footprint = ranks * per_rank
    request = _int(budget, "requested_memory_bytes")
    start = ranks * request if request is not None else footprint
    return {
        "engine": name,
        "ranks": ranks,
        "weights_bytes": ranks * (_int(budget, "weights_per_rank_bytes") or 0),
        "activation_bytes": ranks * (_int(budget, "activation_reserve_bytes") or 0),
        "kv_cache_bytes": ranks * (_int(budget, "kv_cache_bytes") or 0),
        "footprint_bytes": footprint,
        "start_request_bytes": max(start, footprint),
    }


def node_available(budgets: List[Dict[str, Any]]) -> Dict[str, Any]:
    """What the engines may use together: total - reserve of the plans (the smallest if they
    differ). A derived reserve makes that the expected MemAvailable at start (_memavail);
    a given reserve_gib is the operator's word."""
    room = [
        (int(b["total_memory_bytes"]) - (_int(b, "reserve_bytes") or 0), str(b.get("reserve_source") or ""))
        for b in budgets
        if _int(b, "total_memory_bytes") is not None
    ]
    if not room:
        return {"available_bytes": None, "source": "no total_memory_gib in the plans"}
    available, source = min(room)
    if source.startswith("derived"):
        return {"available_bytes": available, "source": "expected MemAvailable at start"}
    return {"available_bytes": available, "source": "total - reserve_gib"}


def plan_node(host: str, engines: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``engines``: [{"name", "budget", "started"}]. Returns rows, the node's numbers,
    ``errors`` (empty when the set fits) and a table for people."""
    started = [e for e in engines if e.get("started", True) and isinstance(e.get("budget"), dict)]
    rows = [engine_row(e["name"], e["budget"]) for e in started]
    node = node_available([e["budget"] for e in started])
    total = max((_int(e["budget"], "total_memory_bytes") or 0 for e in started), default=0) or None
    available = node["available_bytes"]
    errors: List[str] = []
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
