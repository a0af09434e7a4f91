# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OOM diagnosis, step 2: the facts the rules read, from the parsed evidence.

:func:`gather_facts` runs the parsers of ``_diagnose_parse`` over one engine's evidence and
places each kernel event in the launch's time (before it, during the start, at runtime,
after the failure), picks the journal run the verdict is about, the page cache at the
moment of interest and the launches that overlapped this one. The result is one flat dict
(see :func:`gather_facts`); ``_diagnose_rules`` reads only that.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.diagnose.parse import (
    GIB,
    MIB,
    _first,
    align_samples,
    flags_from_args,
    flags_from_argv,
    launch_epoch,
    parse_journal,
    parse_kernel_log,
    parse_metrics,
    parse_samples,
    record_time,
)

DEFAULTS = {
    # (Cached - Mapped) / MemTotal at the failure moment above which page cache counts as the cause.
    "cache_fraction": 0.15,
    # KV cache usage (0-1) from which the cache counts as full.
    "kv_usage_high": 0.90,
    # Prefix-cache hit rate (0-1) below which prefix caching is not paying off under pressure.
    "prefix_hit_low": 0.20,
    # Seconds a second engine's load must overlap this one's to count as a concurrent start.
    "race_overlap_s": 1.0,
    # Runtime OOMs in separate runs (restarts) that make fragmentation chronic.
    "chronic_runs": 2,
    # Reserved-but-unallocated PyTorch memory (bytes) that alone points to fragmentation.
    "fragment_bytes": 1 * GIB,
    "page_size": 4096,
    # Prompt throughput (tokens/s) from which the last stats line counts as load; below it (and with
    # nothing waiting) an OOM is not blamed on a burst. A few requests trickling in are not a burst.
    "load_prompt_tps": 1000.0,
    # Seconds after the launch's failure during which kernel lines still belong to it.
    "after_failure_s": 120.0,
}


def _sample_at(samples: List[Dict[str, float]], t: Optional[float]) -> Optional[Dict[str, float]]:
    if not samples:
        return None
    if t is None:
        return samples[-1]
    before = [s for s in samples if s["t"] <= t]
    return before[-1] if before else samples[0]


def _cache_unmapped(sample: Optional[Dict[str, float]]) -> Optional[float]:
    if not sample or "Cached" not in sample:
        return None
    return max(0.0, float(sample.get("Cached", 0)) - float(sample.get("Mapped", 0)))


def _windows_overlap(mine: Dict[str, Any], other: Dict[str, Any], slack: float) -> Optional[Tuple[float, float]]:
    """Overlap (start, end) of two launches' load windows (start to healthy/failed), or None."""

    def window(rec: Dict[str, Any]) -> Optional[Tuple[float, float]]:
        start = record_time(rec, "started_at")
        if start is None:
            return None
        end = record_time(rec, "healthy_at") or record_time(rec, "failed_at")
        if end is None and isinstance(rec.get("kv_alloc_t"), (int, float)):
            end = start + float(rec["kv_alloc_t"])
        # The load begins when the launcher holds the node's launch lock: time spent waiting for
        # another engine's load is not a concurrent start.
        steps = rec.get("steps") if isinstance(rec.get("steps"), list) else []
        locked = next((s.get("t") for s in steps if isinstance(s, dict) and s.get("name") == "lock-acquired"), None)
        if isinstance(locked, (int, float)) and not isinstance(locked, bool):
            start += float(locked)
        return start, (end if end is not None else start + 3600.0)

    a, b = window(mine), window(other)
    if not a or not b:
        return None
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if hi - lo >= slack else None


class LaunchTimes(NamedTuple):
    """When this launch started, went healthy and failed (epoch seconds or None)."""

    started: Optional[float]
    healthy_at: Optional[float]
    failed_at: Optional[float]
    healthy: bool  # the launch record or the journal says the engine went healthy


def settings_with_defaults(settings: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """DEFAULTS with the given settings over them (a None value keeps the default)."""
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in (settings or {}).items() if v is not None})
    return cfg


def focus_run(runs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The run the verdict is about: the last one with an OOM line, else the last one."""
    last = runs[-1] if runs else None
    failing = next((r for r in reversed(runs) if r["ooms"] or r["killed"]), None)
    return failing or last


def launch_times(launch: Optional[Dict[str, Any]], focus: Optional[Dict[str, Any]]) -> LaunchTimes:
    """The launch's times from its record; the journal's start and healthy lines when the record has none."""
    started = record_time(launch, "started_at")
    if started is None and focus:
        # no launch record (the unit runs the engine without the launcher): the run's own start line
        started = next((e["t"] for e in focus["events"] if e["kind"] == "run_start" and e.get("t") is not None), None)
    healthy_at = record_time(launch, "healthy_at")
    failed_at = record_time(launch, "failed_at")
    if healthy_at is None and focus and focus.get("healthy_t") is not None:
        healthy_at = focus["healthy_t"]
    launch_healthy = bool(launch and launch.get("healthy_at") is not None) or bool(focus and focus["healthy"])
    return LaunchTimes(started, healthy_at, failed_at, launch_healthy)


def _kernel_phase(event: Dict[str, Any], times: LaunchTimes) -> str:
    """startup or runtime, for a kernel event inside this launch's window."""
    if event.get("t") is not None and times.healthy_at is not None:
        return "runtime" if event["t"] > times.healthy_at else "startup"
    if event.get("t") is not None and times.started is not None and times.failed_at is not None:
        return "startup"
    return "runtime" if times.healthy and times.failed_at is None else "startup"


def place_kernel_events(
    events: List[Dict[str, Any]], boot_time: Any, times: LaunchTimes, after_failure_s: float
) -> List[Dict[str, Any]]:
    """Give each kernel event its ``phase`` in this launch; return the ones that belong to it."""
    boot_time = float(boot_time) if isinstance(boot_time, (int, float)) and not isinstance(boot_time, bool) else None
    started, failed_at = times.started, times.failed_at
    for event in events:
        if event.get("t") is None and event.get("rel_t") is not None:
            # plain dmesg counts seconds since boot: placed with the boot time, or not placed at all
            if boot_time is not None:
                event["t"] = boot_time + event["rel_t"]
            elif started is not None:
                event["phase"] = "unplaced"
                continue
        # Only what happened since this launch started counts for it (older lines are history).
        if started is not None and event.get("t") is not None and event["t"] < started - 5:
            event["phase"] = "before"
        elif failed_at is not None and event.get("t") is not None and event["t"] > failed_at + after_failure_s:
            event["phase"] = "after"
        else:
            event["phase"] = _kernel_phase(event, times)
    return [e for e in events if e["phase"] not in ("before", "after", "unplaced")]


def start_failed(
    launch: Optional[Dict[str, Any]], focus: Optional[Dict[str, Any]], times: LaunchTimes, startup_kinds: set
) -> bool:
    """Did this start fail?

    NV_ERR_NO_MEMORY alone does not say so: published DGX Spark dmesg shows the line during
    startups that went healthy and at rest, so it only counts next to a failure.
    """
    focus_failed = (
        bool(focus)
        and not focus["healthy"]
        and bool(focus["ooms"] or focus["killed"] or _first(focus, "engine_failed"))
    )
    kernel_killed = bool(startup_kinds & {"oom_invoked", "oom_killed"})
    failed = bool(launch) and times.failed_at is not None and times.healthy_at is None
    return failed or focus_failed or (kernel_killed and not times.healthy)


def moment_of_interest(launch: Optional[Dict[str, Any]], times: LaunchTimes) -> Optional[float]:
    """The moment on the timeline (seconds since the start): KV allocation, else the failure, else None (the end)."""
    kv_alloc_t = (launch or {}).get("kv_alloc_t")
    if isinstance(kv_alloc_t, (int, float)):
        return float(kv_alloc_t)
    if times.started is not None and times.failed_at is not None:
        return times.failed_at - times.started
    return None


def cache_peak(samples: List[Dict[str, Any]], launch: Optional[Dict[str, Any]]) -> Optional[float]:
    """The page cache's peak (Cached - Mapped, bytes) during the load: samples, or the launcher's own peak."""
    peak = max((float(s.get("Cached", 0)) - float(s.get("Mapped", 0)) for s in samples), default=None)
    launch_peak = (launch or {}).get("page_cache_peak_mib")
    if isinstance(launch_peak, (int, float)):
        peak = max(peak or 0.0, float(launch_peak) * MIB)
    return peak


def overlapping_launches(launch: Optional[Dict[str, Any]], others: Any, slack: float) -> List[Dict[str, Any]]:
    """Other engines' launches whose load overlapped this one's by at least ``slack`` seconds."""
    found = []
    for other in others or []:
        if not isinstance(other, dict) or not launch or other.get("engine") == launch.get("engine"):
            continue
        overlap = _windows_overlap(launch, other, slack)
        if overlap:
            found.append({"engine": other.get("engine"), "started_at": other.get("started_at"), "overlap": overlap})
    return found


def engine_flags(launch: Optional[Dict[str, Any]], focus: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The engine's memory flags: the launcher's argv; without a launch record, the failed run's
    own ``non-default args`` line (vLLM's), else its transient unit's command line (``systemd-run``)."""
    flags = flags_from_argv((launch or {}).get("argv"))
    if flags or not focus:
        return flags
    args = _first(focus, "engine_args")
    if args and args.get("args"):
        return flags_from_args(args["args"])
    start = next((e for e in focus["events"] if e["kind"] == "run_start" and e.get("argv")), None)
    return flags_from_argv(start["argv"]) if start else {}


def gather_facts(evidence: Dict[str, Any], settings: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Parse every piece of evidence into one flat dict the rules read."""
    cfg = settings_with_defaults(settings)
    kernel = parse_kernel_log(evidence.get("dmesg") or "", int(cfg["page_size"]))
    journal = parse_journal(evidence.get("journal") or "")
    metrics = parse_metrics(evidence.get("metrics") or "")
    launch = evidence.get("launch") if isinstance(evidence.get("launch"), dict) else None
    samples = align_samples(parse_samples(evidence.get("samples") or []), launch_epoch(launch))
    meminfo = evidence.get("meminfo") or {}
    mem_total = meminfo.get("MemTotal") or (launch or {}).get("mem_total_bytes")
    runs = journal["runs"]
    focus = focus_run(runs)
    times = launch_times(launch, focus)
    k_now = place_kernel_events(kernel["events"], evidence.get("boot_time"), times, float(cfg["after_failure_s"]))
    kernel_startup = {e["kind"] for e in k_now if e["phase"] == "startup"}
    kernel_runtime = {e["kind"] for e in k_now if e["phase"] == "runtime"}
    moment_t = moment_of_interest(launch, times)
    at = _sample_at(samples, moment_t)
    guard = (launch or {}).get("guard_status") or evidence.get("guard") or {}
    plan = (launch or {}).get("plan") or evidence.get("plan") or {}
    return {
        "cfg": cfg,
        "kernel": kernel,
        "kernel_startup": kernel_startup,
        "kernel_runtime": kernel_runtime,
        "kernel_events": k_now,
        "journal": journal,
        "focus": focus,
        "metrics": metrics,
        "launch": launch,
        "startup_failed": start_failed(launch, focus, times, kernel_startup),
        "samples": samples,
        "mem_total": mem_total,
        "moment_t": moment_t,
        "sample_at_moment": at,
        "cache_unmapped_at_moment": _cache_unmapped(at),
        "cache_peak": cache_peak(samples, launch),
        "guard": guard if isinstance(guard, dict) else {},
        "others": overlapping_launches(launch, evidence.get("other_launches"), float(cfg["race_overlap_s"])),
        "plan": plan if isinstance(plan, dict) else {},
        "flags": engine_flags(launch, focus),
        "sysctl": evidence.get("sysctl") or {},
        "stats": [e for r in runs for e in r["events"] if e["kind"] == "stats"],
        "restarts": journal["restarts"],
    }
