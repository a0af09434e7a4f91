# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter of the uma.vllm.vllm_service role: every started engine of a node budgeted
together (plugins/module_utils/plan/node_budget.py)."""

from __future__ import annotations

import importlib
from typing import Any, Dict, List


def node_budget(results: List[Dict[str, Any]], hostname: str) -> Dict[str, Any]:
    """Registered uma.vllm.vllm_flags loop results (``item`` = the engine) -> the node's
    budget: ``errors`` (empty when the set fits), ``table``, per-engine rows."""
    engines = []
    for result in results or []:
        item = result.get("item") or {}
        engines.append(
            {
                "name": str(item.get("name", "?")),
                "budget": result.get("budget"),
                "started": item.get("state", "started") == "started",
            }
        )
    # imported at the first call: see lazy() in vllm_service.py
    plan = importlib.import_module("ansible_collections.uma.vllm.plugins.module_utils.plan.node_budget")
    return plan.plan_node(hostname, engines)


class FilterModule:
    def filters(self):
        return {"vllm_service_node_budget": node_budget}
