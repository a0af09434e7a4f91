# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OOM diagnosis, last step: the report a person reads (Markdown) and the watchdog's lines.

The machine-readable form is the result dict of ``_diagnose.diagnose`` itself (the playbook
``uma.vllm.diagnose`` writes it as JSON); the memory timeline SVG is ``_timeline``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.diagnose.parse import fmt_bytes


def watchdog_lines(wd: Dict[str, Any]) -> List[str]:
    """The watchdog section of a report, one line per fact (also used as verdict evidence)."""
    out = []
    if wd.get("phase"):
        out.append("watchdog phase %s: %s" % (wd["phase"], wd.get("reason") or ""))
    if wd.get("gave_up"):
        out.append("watchdog GAVE UP: every rank is stopped and left stopped")
    counts = wd.get("counts") or {}
    if counts:
        out.append(
            "watchdog counts: %s"
            % ", ".join(
                "%s %s" % (k, counts[k])
                for k in ("wedges", "restarts", "floor_warn", "floor_critical", "gave_up")
                if k in counts
            )
        )
    for e in wd.get("events") or []:
        if e["action"] in ("restart", "gave_up", "evict", "peer-stop", "peer-start", "peer-gave-up"):
            out.append(
                "%s watchdog %s: %s%s"
                % (
                    e.get("at") or "?",
                    e["action"],
                    e["reason"],
                    " [%s]" % "; ".join(e["evidence"]) if e["evidence"] else "",
                )
            )
    return out


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def _watchdog_section(wd: Dict[str, Any]) -> List[str]:
    """What the engine watchdog saw and did: one summary line, the last reason, the actions as a table."""
    out = ["## Engine watchdog", ""]
    out.append(
        "Phase **%s**%s; %d wedges, %d restarts (%d for memory), %d evictions%s."
        % (
            wd.get("phase") or "unknown (state.json unreadable)",
            " (GAVE UP: every rank left stopped)" if wd.get("gave_up") else "",
            wd.get("wedges") or 0,
            wd.get("restarts") or 0,
            wd.get("floor_restarts") or 0,
            wd.get("evictions") or 0,
            "; %d unreadable records skipped" % wd["unreadable"] if wd.get("unreadable") else "",
        )
    )
    if wd.get("reason"):
        out += ["", "Last reason: %s" % wd["reason"]]
    if wd.get("events"):
        out += ["", "| at | action | reason | evidence |", "| --- | --- | --- | --- |"]
        for e in wd["events"]:
            out.append(
                "| %s | %s | %s | %s |"
                % (
                    e.get("at") or "",
                    e["action"],
                    _md_escape(e["reason"][:200]),
                    _md_escape("; ".join(e["evidence"])[:400]),
                )
            )
        if wd.get("events_omitted"):
            out.append("")
            out.append("(%d older actions not listed)" % wd["events_omitted"])
    out.append("")
    return out


def _others_section(others: List[Dict[str, Any]]) -> List[str]:
    if not others:
        return []
    out = ["## Other findings", "", "| class | confidence | first evidence |", "| --- | --- | --- |"]
    for o in others:
        first = o["evidence"][0] if o["evidence"] else ""
        out.append("| `%s` | %.2f | %s |" % (o["class"], o["confidence"], _md_escape(first[:160])))
    out.append("")
    return out


def _settings_section(settings: Dict[str, Any]) -> List[str]:
    out = ["## Settings in force", "", "| setting | value |", "| --- | --- |"]
    for group in ("flags", "plan", "sysctl", "guard"):
        for key, value in sorted((settings.get(group) or {}).items()):
            shown = value
            if key.endswith("_bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
                shown = "%s (%s)" % (value, fmt_bytes(value))
            out.append("| %s.%s | %s |" % (group, key, _md_escape(shown)))
    return out


def _sources_section(summary: Dict[str, Any]) -> List[str]:
    out = ["", "## What was read", "", "| source | value |", "| --- | --- |"]
    for key, value in summary.items():
        if value is not None:
            shown = fmt_bytes(value) if key.endswith("_bytes") else value
            out.append("| %s | %s |" % (key, _md_escape(shown)))
    out.append("")
    return out


def render_markdown(host: str, result: Dict[str, Any], timeline_file: Optional[str] = None) -> str:
    """A report a person reads at a glance: verdict, fix, evidence, then the details."""
    s = result["summary"]
    out = [
        "# OOM diagnosis: %s%s" % (host, " / %s" % s["engine"] if s.get("engine") else ""),
        "",
        "**%s** (`%s`, confidence %.2f)" % (result["title"], result["class"], result["confidence"]),
        "",
        "## Fix",
        "",
    ]
    out += ["- %s" % line for line in result["fix"]]
    out += ["", "## Evidence", "", "```text"]
    out += [line if len(line) <= 400 else line[:397] + "..." for line in result["evidence"]]
    out += ["```", ""]
    if timeline_file:
        out += ["## Memory during the load", "", "![memory timeline](%s)" % timeline_file, ""]
    if result.get("watchdog"):
        out += _watchdog_section(result["watchdog"])
    out += _others_section(result["others"])
    out += _settings_section(result["settings"])
    out += _sources_section(s)
    return "\n".join(out)
