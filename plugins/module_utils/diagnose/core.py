# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Out-of-memory diagnosis for vLLM engines on unified-memory nodes (pure logic).

The evidence an operator needs to tell the causes of an OOM apart lies on the
node: the kernel log, the engine's journal (vLLM's own log lines and the
launcher's), the /metrics text, the launcher's ``launch.json`` and the guard's
``samples.jsonl``, the sysctls in force. :func:`diagnose` takes all of it as
plain values (strings, dicts, lists), parses it into facts, runs a table of
rules over the facts and returns the verdict: the class, the evidence lines
that decided it, the confidence and the concrete change that fixes it.

Nothing here reads files or runs commands; ``_diagnose_node`` does that for the
module ``oom_diagnose``, and the unit tests feed excerpts directly.

The work is split by step, one file each (this file is the entry point and keeps every
public name importable from here):

- ``_diagnose_parse``    kernel log, engine journal, /metrics, samples, launch record;
- ``_diagnose_watchdog`` the engine watchdog's state.json / events.json;
- ``_diagnose_facts``    :func:`gather_facts`: the parsed evidence placed in the launch's time;
- ``_diagnose_rules``    the rule table and :func:`classify` (facts -> findings -> verdict);
- ``_diagnose_render``   the Markdown report and the watchdog's lines;
- ``_diagnose_node``     what ``oom_diagnose`` runs on the node (reads files and commands).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ansible_collections.uma.vllm.plugins.module_utils.diagnose.facts import DEFAULTS, gather_facts
from ansible_collections.uma.vllm.plugins.module_utils.diagnose.parse import (
    GIB,
    MIB,
    align_samples,
    flags_from_argv,
    fmt_bytes,
    launch_epoch,
    line_time,
    parse_journal,
    parse_kernel_log,
    parse_metrics,
    parse_samples,
    parse_time,
    record_time,
    size_to_bytes,
)
from ansible_collections.uma.vllm.plugins.module_utils.diagnose.render import render_markdown, watchdog_lines
from ansible_collections.uma.vllm.plugins.module_utils.diagnose.rules import (
    CLASSES,
    GUARD_MODE,
    RULES,
    TITLES,
    classify,
    rule_admission_refused,
    rule_fragmentation,
    rule_page_cache_starvation,
    rule_prefix_cache_pressure,
    rule_profiling_race,
    rule_runtime_burst,
    rule_startup_oom,
)
from ansible_collections.uma.vllm.plugins.module_utils.diagnose.watchdog import (
    WATCHDOG_ACTIONS,
    WATCHDOG_LISTED,
    summarize_watchdog,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard.config import DEFAULT_MODE

# The names importers use from here (tests, the module, the timeline), wherever they live now.
__all__ = [
    "CLASSES",
    "DEFAULTS",
    "DEFAULT_MODE",
    "GIB",
    "GUARD_MODE",
    "MIB",
    "RULES",
    "TITLES",
    "WATCHDOG_ACTIONS",
    "WATCHDOG_LISTED",
    "align_samples",
    "classify",
    "diagnose",
    "flags_from_argv",
    "fmt_bytes",
    "gather_facts",
    "launch_epoch",
    "line_time",
    "parse_journal",
    "parse_kernel_log",
    "parse_metrics",
    "parse_samples",
    "parse_time",
    "record_time",
    "render_markdown",
    "rule_admission_refused",
    "rule_fragmentation",
    "rule_page_cache_starvation",
    "rule_prefix_cache_pressure",
    "rule_profiling_race",
    "rule_runtime_burst",
    "rule_startup_oom",
    "settings_in_force",
    "size_to_bytes",
    "summarize_watchdog",
    "watchdog_lines",
]


def settings_in_force(facts: Dict[str, Any]) -> Dict[str, Any]:
    """What the report shows as the settings in force."""
    guard = facts["guard"] or {}
    return {
        "flags": facts["flags"],
        "plan": {k: v for k, v in facts["plan"].items() if not isinstance(v, (dict, list))},
        "sysctl": facts["sysctl"],
        "guard": {
            k: guard.get(k) for k in ("mode", "state", "evictions", "evicted_bytes", "peak_cache_mib") if k in guard
        },
    }


def diagnose(evidence: Dict[str, Any], settings: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Evidence in, verdict out (see the module docstring)."""
    facts = gather_facts(evidence, settings)
    result = classify(facts)
    launch = facts["launch"] or {}
    samples = facts["samples"]
    summary = {
        "engine": launch.get("engine") or evidence.get("engine"),
        "launch_started_at": launch.get("started_at"),
        "launch_outcome": "healthy"
        if launch.get("healthy_at") is not None
        else ("failed" if launch.get("failed_at") is not None else None),
        "runs_in_journal": len(facts["journal"]["runs"]),
        "restarts": facts["restarts"],
        "kernel_events": len(facts["kernel_events"]),
        "samples": len(samples),
        "kv_alloc_t": launch.get("kv_alloc_t"),
        "mem_total_bytes": facts["mem_total"],
        "cache_peak_bytes": facts["cache_peak"],
    }
    watchdog = evidence.get("watchdog") if isinstance(evidence.get("watchdog"), dict) else None
    lines = list(result["verdict"]["evidence"])
    if watchdog and result["verdict"]["class"] == "none":
        # no out-of-memory cause, but the engine may still have been restarted or stopped: say so
        lines += watchdog_lines(watchdog)
    return {
        "watchdog": watchdog,
        "class": result["verdict"]["class"],
        "title": result["verdict"]["title"],
        "confidence": result["verdict"]["confidence"],
        "evidence": lines,
        "fix": result["verdict"]["fix"],
        "others": [{k: o[k] for k in ("class", "title", "confidence", "evidence", "fix")} for o in result["others"]],
        "summary": summary,
        "settings": settings_in_force(facts),
        "metrics": {k: v for k, v in facts["metrics"].items() if k != "present"},
    }
