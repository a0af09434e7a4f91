# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OOM diagnosis: the engine watchdog's records (uma_watchdog.py: <state_dir>/watchdog/<engine>/).

:func:`summarize_watchdog` reads ``state.json`` and ``events.json`` (already loaded, possibly
garbled) into what the report shows; ``_diagnose_render.watchdog_lines`` writes it as lines.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.diagnose.parse import _finite, fmt_bytes

# Actions that say what the watchdog saw and did; "start"/"exit" of the watchdog itself and
# plain phase changes are counted but not listed one by one.
WATCHDOG_ACTIONS = ("restart", "gave_up", "evict", "record", "peer-stop", "peer-start", "peer-gave-up", "phase")
WATCHDOG_LISTED = 20


def _wd_mem(mem: Any, floors: Any) -> Optional[str]:
    if not isinstance(mem, dict) or not _finite(mem.get("available")):
        return None
    text = "MemAvailable %s" % fmt_bytes(mem["available"])
    if isinstance(floors, dict):
        parts = [
            "%s floor %s" % (name, fmt_bytes(floors[key]))
            for name, key in (("warning", "warn_bytes"), ("critical", "critical_bytes"))
            if _finite(floors.get(key))
        ]
        if parts:
            text += " (%s)" % ", ".join(parts)
    if _finite(mem.get("gpu_headroom")):
        text += ", GPU headroom %s" % fmt_bytes(mem["gpu_headroom"])
    return text


def _wd_evidence(ev: Any, floors: Any) -> List[str]:
    """The observations of one watchdog action, as short phrases (whatever of them is readable)."""
    if not isinstance(ev, dict):
        return []
    out = []
    if isinstance(ev.get("kind"), str):
        out.append("kind %s" % ev["kind"])
    local = ev.get("local")
    if isinstance(local, dict) and local.get("ok") is False and local.get("reason"):
        out.append("local rank: %s" % local["reason"])
    if isinstance(ev.get("unit"), str) and ev["unit"] not in ("active",):
        out.append("unit %s" % ev["unit"])
    for name, label in (("health", "/health"), ("probe", "1-token completion")):
        probe = ev.get(name)
        if isinstance(probe, dict) and probe.get("ok") is False:
            out.append("%s failed: %s" % (label, probe.get("error") or "no answer"))
    peers = ev.get("peers")
    if isinstance(peers, dict):
        for peer, view in sorted(peers.items(), key=lambda kv: str(kv[0])):
            if isinstance(view, dict) and view.get("ok") is False:
                out.append("peer %s: %s" % (peer, view.get("reason") or "down"))
    mem = _wd_mem(ev.get("mem"), ev.get("floors") or floors)
    if mem:
        out.append(mem)
    result = ev.get("result") if isinstance(ev.get("result"), dict) else ev.get("evicted")
    if isinstance(result, dict) and _finite(result.get("bytes_advised")):
        out.append("evicted %s in %s files" % (fmt_bytes(result["bytes_advised"]), result.get("files", "?")))
    stop = ev.get("stop")
    if isinstance(stop, dict):
        out.append(
            "stop %s%s"
            % (
                "failed: %s" % stop["error"] if stop.get("error") else "done",
                " in %.1f s" % stop["duration_s"] if _finite(stop.get("duration_s")) else "",
            )
        )
    start = ev.get("start")
    if isinstance(start, dict):
        out.append("start failed: %s" % start["error"] if start.get("error") else "started again")
    for key, label in (("peers_stopped", "peers stopped"), ("peers_started", "peers started")):
        acks = ev.get(key)
        if isinstance(acks, dict) and isinstance(acks.get("missing"), list) and acks["missing"]:
            out.append("%s: not acknowledged by %s" % (label, ", ".join(str(m) for m in acks["missing"])))
    return out


def summarize_watchdog(state: Any, events: Any) -> Optional[Dict[str, Any]]:
    """What the engine watchdog saw and did, from its ``state.json`` and ``events.json``.

    Both may be missing or garbled (None, wrong types, entries without fields): whatever is
    readable is used, the rest is counted under ``unreadable``; never an exception. None when
    there is nothing at all.
    """
    state = state if isinstance(state, dict) else None
    rows = events if isinstance(events, list) else []
    if state is None and not rows:
        return None
    unreadable = 0
    listed, tally = [], {}
    floors = (state or {}).get("floors")
    for entry in rows:
        if not isinstance(entry, dict) or not isinstance(entry.get("action"), str):
            unreadable += 1
            continue
        action = entry["action"]
        tally[action] = tally.get(action, 0) + 1
        if action not in WATCHDOG_ACTIONS:
            continue
        reason = entry.get("reason") if isinstance(entry.get("reason"), str) else ""
        listed.append(
            {
                "at": entry.get("at") if isinstance(entry.get("at"), str) else None,
                "action": action,
                "reason": reason,
                "evidence": _wd_evidence(entry.get("evidence"), floors),
            }
        )
    counts = (state or {}).get("counts")
    counts = {k: v for k, v in counts.items() if isinstance(v, int)} if isinstance(counts, dict) else {}
    phase = (state or {}).get("phase") if isinstance((state or {}).get("phase"), str) else None
    summary = {
        "phase": phase,
        "reason": (state or {}).get("reason") if isinstance((state or {}).get("reason"), str) else None,
        "gave_up": phase == "gave_up" or (bool(listed) and listed[-1]["action"] in ("gave_up", "peer-gave-up")),
        "counts": counts,
        "restarts_in_window": (state or {}).get("restarts_in_window"),
        "floor": (state or {}).get("floor"),
        "updated_at": (state or {}).get("updated_at"),
        "rank": (state or {}).get("rank"),
        "actions": tally,
        "wedges": counts.get("wedges", 0),
        "restarts": tally.get("restart", 0),
        "floor_restarts": sum(1 for e in listed if e["action"] == "restart" and "kind floor" in e["evidence"]),
        "evictions": tally.get("evict", 0),
        "events": listed[-WATCHDOG_LISTED:],
        "events_omitted": max(0, len(listed) - WATCHDOG_LISTED),
        "unreadable": unreadable,
    }
    if state is None:
        summary["unreadable_state"] = True
    return summary
