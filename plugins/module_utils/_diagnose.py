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

Nothing here reads files or runs commands; the module ``oom_diagnose`` does
that and the unit tests feed excerpts directly.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

try:
    from ansible_collections.uma.vllm.plugins.module_utils._guard_config import DEFAULT_MODE
except ImportError:  # pragma: no cover - node-side use without Ansible
    from _guard_config import DEFAULT_MODE  # type: ignore[no-redef]

GIB = 1024**3
MIB = 1024**2

# Class ids, in the order a report lists them and ties are broken.
CLASSES = (
    "admission_refused",
    "profiling_race",
    "page_cache_starvation",
    "startup_oom",
    "fragmentation",
    "runtime_burst",
    "prefix_cache_pressure",
    "none",
)

TITLES = {
    "admission_refused": "Start refused at admission: the node had not the memory the plan's start needs",
    "startup_oom": "Startup OOM: weights + KV cache over the memory budget",
    "page_cache_starvation": "UMA page-cache starvation at load",
    "profiling_race": "Concurrent-start memory-profiling race",
    "runtime_burst": "Runtime burst: long prompts / too many batched tokens",
    "fragmentation": "Chronic allocator fragmentation",
    "prefix_cache_pressure": "KV / prefix-cache pressure (no OOM, requests queue and get preempted)",
    "none": "No out-of-memory cause found",
}

# The guard mode that holds the page cache down during the load: the guard's own default
# (_guard_config.DEFAULT_MODE, chosen by benchmarks/page_cache.py), not a copy of it.
GUARD_MODE = DEFAULT_MODE

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

_REL_TIME_RE = re.compile(r"^\[\s*(\d+\.\d+)\]")
_MEMORY_WORDS = re.compile(r"memory|OutOfMemory|NO_MEMORY|KV cache|oom|CUDA error", re.IGNORECASE)

# ---------------------------------------------------------------------------
# Small parsers
# ---------------------------------------------------------------------------

_UNITS = {"B": 1, "KiB": 1024, "MiB": MIB, "GiB": GIB, "TiB": 1024**4, "kB": 1024, "KB": 1024}


def size_to_bytes(text: str) -> Optional[int]:
    """'14.75 GiB' -> bytes; None when the text is not a size."""
    m = re.match(r"\s*(-?[\d.]+)\s*([KMGT]iB|kB|KB|B)\s*$", text or "")
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _num(text: str) -> float:
    return float(text.replace(",", ""))


_ISO_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?)([+-]\d\d:?\d\d|Z)?")
_CTIME_RE = re.compile(r"^\[(?:\w{3} )?(\w{3}) +(\d+) (\d\d):(\d\d):(\d\d) (\d{4})\]")
_MONTHS = {m: i + 1 for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split())}


def parse_time(value: Any) -> Optional[float]:
    """Epoch seconds from an ISO 8601 string (as in launch.json and ``journalctl -o short-iso``)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _ISO_RE.match(str(value).strip())
    if not m:
        return None
    stamp, zone = m.group(1), m.group(2) or "+00:00"
    if zone == "Z":
        zone = "+00:00"
    elif ":" not in zone:
        zone = zone[:3] + ":" + zone[3:]
    stamp = stamp.replace(",", ".")  # dmesg --time-format iso writes a decimal comma
    if "." in stamp:
        head, frac = stamp.split(".", 1)
        stamp = head + "." + (frac + "000000")[:6]
    try:
        return datetime.datetime.fromisoformat(stamp + zone).timestamp()
    except ValueError:
        return None


def line_time(line: str) -> Optional[float]:
    """Timestamp at the start of a journal or ``dmesg -T`` line, else None."""
    t = parse_time(line[:40])
    if t is not None:
        return t
    m = _CTIME_RE.match(line)
    if m:
        month = _MONTHS.get(m.group(1))
        if month:
            when = datetime.datetime(
                int(m.group(6)),
                month,
                int(m.group(2)),
                int(m.group(3)),
                int(m.group(4)),
                int(m.group(5)),
                tzinfo=datetime.timezone.utc,
            )
            return when.timestamp()
    return None


def record_time(record: Optional[Dict[str, Any]], key: str) -> Optional[float]:
    """Epoch seconds of ``started_at`` / ``healthy_at`` / ``failed_at`` in a launch record.

    The launcher writes ``started_at`` as an ISO time and the other two as seconds since the
    start (its ``t``); ISO times are accepted for all of them.
    """
    if not record:
        return None
    value = record.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "started_at":
        start = parse_time(record.get("started_at"))
        return None if start is None else start + float(value)
    return parse_time(value) if isinstance(value, str) else None


def fmt_bytes(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= GIB:
        return "%.2f GiB" % (value / GIB)
    return "%.0f MiB" % (value / MIB)


# ---------------------------------------------------------------------------
# Kernel log
# ---------------------------------------------------------------------------

_K_NV_NOMEM = re.compile(r"NV_ERR_NO_MEMORY")
_K_OOM_INVOKED = re.compile(r"(\S+(?: \S+)?) invoked oom-killer: gfp_mask=(\S+)")
_K_OOM_KILLED = re.compile(
    r"(Memory cgroup out of memory|Out of memory): Killed process (\d+) \(([^)]*)\)"
    r"(?: total-vm:(\d+)kB, anon-rss:(\d+)kB, file-rss:(\d+)kB)?"
)
_K_UVM = re.compile(r"\[nvidia_uvm\]|\buvm_\w+|phys_mem_allocate")
_K_SYSMEM = re.compile(r"sysmemAllocResources|_memdescAllocInternal|memdescAlloc\w*|\[nvidia\]")
_K_NODE_FILE = re.compile(r"Node \d+ .*?active_file:(\d+)kB inactive_file:(\d+)kB")
_K_PAGES_FILE = re.compile(r"\bactive_file:(\d+) inactive_file:(\d+)\b(?!kB)")


def parse_kernel_log(text: str, page_size: int = 4096) -> Dict[str, Any]:
    """Events of interest in a kernel log (``dmesg``, ``dmesg -T`` or ``journalctl -k``)."""
    events: List[Dict[str, Any]] = []
    for number, raw in enumerate((text or "").splitlines()):
        line = raw.rstrip()
        if not line:
            continue
        when = line_time(line)
        kind = None
        data: Dict[str, Any] = {}
        if _K_NV_NOMEM.search(line):
            kind = "nv_no_memory"
        elif _K_OOM_INVOKED.search(line):
            m = _K_OOM_INVOKED.search(line)
            kind = "oom_invoked"
            data = {"process": m.group(1).split()[-1], "gfp_mask": m.group(2)}
        elif _K_OOM_KILLED.search(line):
            m = _K_OOM_KILLED.search(line)
            kind = "oom_killed"
            data = {"cgroup": m.group(1).startswith("Memory cgroup"), "pid": int(m.group(2)), "process": m.group(3)}
            if m.group(5):
                data["anon_rss_bytes"] = int(m.group(5)) * 1024
        elif _K_UVM.search(line):
            kind = "uvm_trace"
        elif _K_SYSMEM.search(line) and ("+0x" in line or "NVRM" in line):
            kind = "sysmem_trace"
        if _K_NODE_FILE.search(line):
            m = _K_NODE_FILE.search(line)
            kind = "oom_file_pages"
            data = {"file_bytes": (int(m.group(1)) + int(m.group(2))) * 1024}
        elif kind is None and _K_PAGES_FILE.search(line):
            m = _K_PAGES_FILE.search(line)
            kind = "oom_file_pages"
            data = {"file_bytes": (int(m.group(1)) + int(m.group(2))) * page_size}
        if kind:
            if when is None:
                rel = _REL_TIME_RE.match(line)
                if rel:
                    data["rel_t"] = float(rel.group(1))  # plain dmesg: seconds since boot
            events.append({"kind": kind, "line": line.strip(), "n": number, "t": when, **data})
    kinds = {e["kind"] for e in events}
    return {
        "events": events,
        "nv_no_memory": "nv_no_memory" in kinds,
        "oom_kill": bool(kinds & {"oom_invoked", "oom_killed"}),
        "nvidia_trace": bool(kinds & {"uvm_trace", "sysmem_trace"}),
        "file_bytes_at_oom": max((e["file_bytes"] for e in events if e["kind"] == "oom_file_pages"), default=None),
    }


# ---------------------------------------------------------------------------
# Engine journal (launcher + vLLM + systemd lines)
# ---------------------------------------------------------------------------

_J_PATTERNS: List[Tuple[str, re.Pattern[str]]] = [
    ("profiling_error", re.compile(r"Error in memory profiling")),
    (
        "kv_insufficient",
        re.compile(
            r"To serve at least one request with the models?'s max seq len \(([\d,]+)\),? \(?([\d.]+) GiB KV"
            r" cache is needed, which is larger than the available KV cache memory \((-?[\d.]+) GiB\)"
            r"(?:\. Based on the available memory, the estimated maximum model length is ([\d,]+))?"
        ),
    ),
    ("kv_none", re.compile(r"No available memory for the cache blocks")),
    (
        "kv_request_over",
        re.compile(
            r"Available memory on node \d+ \(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than"
            r" requested memory for kv \((-?[\d.]+)(?:/([\d.]+))? GiB\)"
        ),
    ),
    (
        "startup_free",
        re.compile(
            r"(?:Free|Available) memory on (?:device|node)(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less"
            r" than desired (?:GPU|CPU) memory utilization \(([\d.]+), ([\d.]+) GiB\)"
        ),
    ),
    (
        "cuda_oom",
        re.compile(
            r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)\.(?: GPU (\d*) ?has a total capacity of"
            r" ([\d.]+ [KMGT]iB) of which ([\d.]+ [KMGT]iB) is free\.)?"
        ),
    ),
    ("cuda_error_oom", re.compile(r"CUDA error: out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED")),
    ("kv_available", re.compile(r"Available KV cache memory:\s*(-?[\d.]+)\s*GiB")),
    (
        "kv_size",
        re.compile(
            r"(\w+)(?: \+ host)? KV cache size:\s*([\d,]+)\s*tokens"
            r"(?:, Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x)?"
        ),
    ),
    ("kv_cpu_set", re.compile(r"(?:Explicitly|Auto) set \(([\d.]+)/([\d.]+)\) GiB for KV cache")),
    ("weights", re.compile(r"Model loading took ([\d.]+) GiB(?: memory)?(?: and ([\d.]+) seconds)?")),
    (
        "stats",
        re.compile(
            r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s,"
            r" Running: (\d+) reqs,(?: Swapped: \d+ reqs,)? (?:Pending|Waiting): (\d+) reqs"
        ),
    ),
    ("preempted_v0", re.compile(r"preempted by PreemptionMode\.\w+ mode because there is not enough KV cache space")),
    ("run_start", re.compile(r"\[vllm-uma-launch [^\]]+\] launch t=")),
    (
        "healthy",
        re.compile(
            r"Application startup complete|Uvicorn running on|Starting vLLM (?:API )?server on|\] engine-healthy "
        ),
    ),
    (
        "engine_failed",
        re.compile(r"EngineCore failed to start|Engine core initialization failed|EngineDeadError|\] launch-failed "),
    ),
    ("restart", re.compile(r"Scheduled restart job, restart counter is at (\d+)")),
    ("exit", re.compile(r"Main process exited, code=(\w+), status=(\S+)")),
    ("unit_result", re.compile(r"Failed with result '([\w-]+)'")),
    ("run_end", re.compile(r"Stopped uma-vllm@|Stopped vLLM|: Deactivated successfully")),
    # Last: any other exception, to name a start that failed for a reason that is not memory.
    ("exception", re.compile(r"\b((?:\w+\.)*\w*(?:Error|Exception)): (\S.*)$")),
]
_STAT_PREEMPT = re.compile(r"Preemptions: (\d+)")
_STAT_KV = re.compile(r"(?:GPU|CPU|\w+) KV cache usage: ([\d.]+)%")
_STAT_PREFIX = re.compile(r"Prefix cache hit rate: (?:GPU: )?([\d.]+)%")
_CUDA_RESERVED = re.compile(r"and ([\d.]+ [KMGT]iB) is reserved by PyTorch but unallocated")
_CUDA_ALLOCATED = re.compile(r"Of the allocated memory ([\d.]+ [KMGT]iB) is allocated by PyTorch")
_CUDA_OTHER_PROC = re.compile(r"Process (\d+) has ([\d.]+ [KMGT]iB) memory in use")

# What ends a run of the engine (a new run starts with the next line).
_RUN_ENDERS = {"exit", "restart", "unit_result", "run_end"}
# Failure lines (an OOM or a refusal to size the cache).
_OOM_KINDS = {
    "profiling_error",
    "kv_insufficient",
    "kv_none",
    "kv_request_over",
    "startup_free",
    "cuda_oom",
    "cuda_error_oom",
}


def _journal_event(kind: str, m: re.Match[str], line: str) -> Dict[str, Any]:
    data: Dict[str, Any] = {}
    if kind == "kv_insufficient":
        data = {
            "max_model_len": int(_num(m.group(1))),
            "needed_bytes": int(float(m.group(2)) * GIB),
            "available_bytes": int(float(m.group(3)) * GIB),
        }
        if m.group(4):
            data["estimated_max_len"] = int(_num(m.group(4)))
    elif kind == "kv_request_over":
        data = {
            "available_bytes": int(float(m.group(1)) * GIB),
            "total_bytes": int(float(m.group(2)) * GIB),
            "requested_bytes": int(float(m.group(3)) * GIB),
        }
        if m.group(4):  # "(kv/requested-for-the-worker GiB)": the size came from the utilization
            data["requested_total_bytes"] = int(float(m.group(4)) * GIB)
    elif kind == "startup_free":
        data = {
            "free_bytes": int(float(m.group(1)) * GIB),
            "total_bytes": int(float(m.group(2)) * GIB),
            "utilization": float(m.group(3)),
            "requested_bytes": int(float(m.group(4)) * GIB),
        }
    elif kind == "cuda_oom":
        data = {"tried_bytes": size_to_bytes(m.group(1))}
        if m.group(3):
            data["total_bytes"] = size_to_bytes(m.group(3))
            data["free_bytes"] = size_to_bytes(m.group(4))
        r = _CUDA_RESERVED.search(line)
        if r:
            data["reserved_unallocated_bytes"] = size_to_bytes(r.group(1))
        a = _CUDA_ALLOCATED.search(line)
        if a:
            data["allocated_bytes"] = size_to_bytes(a.group(1))
        others = _CUDA_OTHER_PROC.findall(line)
        if others:
            data["other_processes"] = [{"pid": int(p), "bytes": size_to_bytes(s)} for p, s in others]
    elif kind == "kv_available":
        data = {"available_bytes": int(float(m.group(1)) * GIB)}
    elif kind == "kv_size":
        data = {"device": m.group(1), "tokens": int(_num(m.group(2)))}
        if m.group(4):
            data["max_model_len"] = int(_num(m.group(3)))
            data["max_concurrency"] = float(m.group(4))
    elif kind == "kv_cpu_set":
        data = {"available_bytes": int(float(m.group(1)) * GIB)}
    elif kind == "weights":
        data = {"weights_bytes": int(float(m.group(1)) * GIB)}
    elif kind == "stats":
        data = {
            "prompt_tps": float(m.group(1)),
            "generation_tps": float(m.group(2)),
            "running": int(m.group(3)),
            "waiting": int(m.group(4)),
        }
        for key, pat in (("preemptions", _STAT_PREEMPT), ("kv_usage", _STAT_KV), ("prefix_hit", _STAT_PREFIX)):
            s = pat.search(line)
            if s:
                data[key] = int(s.group(1)) if key == "preemptions" else float(s.group(1)) / 100.0
    elif kind == "restart":
        data = {"counter": int(m.group(1))}
    elif kind == "exit":
        data = {"code": m.group(1), "status": m.group(2)}
    elif kind == "unit_result":
        data = {"result": m.group(1)}
    return data


def _join_wrapped(lines: List[str]) -> List[str]:
    """PyTorch prints its OOM message over several lines in some logs: join the continuation."""
    out: List[str] = []
    for line in lines:
        stripped = line.strip()
        if (
            out
            and "CUDA out of memory" in out[-1]
            and (
                stripped.startswith(("Tried to allocate", "GPU ", "Process ", "Including", "Of the allocated", "and "))
            )
        ):
            out[-1] = out[-1].rstrip() + " " + stripped
        else:
            out.append(line)
    return out


def parse_journal(text: str) -> Dict[str, Any]:
    """Split the engine's journal into runs and pick out the lines that matter."""
    runs: List[Dict[str, Any]] = []
    current: Dict[str, Any] = {"events": [], "healthy_n": None}
    ended = False
    for number, raw in enumerate(_join_wrapped((text or "").splitlines())):
        line = raw.rstrip()
        if not line.strip():
            continue
        for kind, pattern in _J_PATTERNS:
            m = pattern.search(line)
            if not m:
                continue
            if (ended and kind not in _RUN_ENDERS) or (kind == "run_start" and current["events"]):
                runs.append(current)
                current = {"events": [], "healthy_n": None}
                ended = False
            event = {"kind": kind, "line": line.strip(), "n": number, "t": line_time(line)}
            event.update(_journal_event(kind, m, line))
            current["events"].append(event)
            if kind == "healthy" and current["healthy_n"] is None:
                current["healthy_n"] = number
            if kind in _RUN_ENDERS:
                ended = True
            break
    if current["events"]:
        runs.append(current)
    for run in runs:
        healthy_n = run["healthy_n"]
        for event in run["events"]:
            event["phase"] = "runtime" if healthy_n is not None and event["n"] > healthy_n else "startup"
        run["healthy"] = healthy_n is not None
        run["ooms"] = [e for e in run["events"] if e["kind"] in _OOM_KINDS]
        killed = [e for e in run["events"] if e["kind"] == "unit_result" and e.get("result") == "oom-kill"]
        killed += [e for e in run["events"] if e["kind"] == "exit" and e.get("status") in ("9/KILL", "KILL")]
        run["killed"] = sorted(killed, key=lambda e: e["n"])
        run["healthy_t"] = next((e["t"] for e in run["events"] if e["kind"] == "healthy"), None)
    restarts = [e.get("counter", 0) for r in runs for e in r["events"] if e["kind"] == "restart"]
    return {"runs": runs, "restarts": max(restarts, default=0)}


def _first(run: Optional[Dict[str, Any]], kind: str) -> Optional[Dict[str, Any]]:
    if not run:
        return None
    return next((e for e in run["events"] if e["kind"] == kind), None)


def _last(run: Optional[Dict[str, Any]], kind: str) -> Optional[Dict[str, Any]]:
    if not run:
        return None
    found = [e for e in run["events"] if e["kind"] == kind]
    return found[-1] if found else None


# ---------------------------------------------------------------------------
# /metrics
# ---------------------------------------------------------------------------

_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> Dict[str, Any]:
    """vLLM's Prometheus text: the values a diagnosis needs, for old and new metric names."""
    values: Dict[str, List[float]] = {}
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.match(line.strip())
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        values.setdefault(m.group(1), []).append(value)

    def pick(*names: str, how: Callable[[List[float]], float] = sum) -> Optional[float]:
        for name in names:
            if name in values:
                return how(values[name])
        return None

    result: Dict[str, Any] = {
        "present": bool(values),
        "kv_usage": pick("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", how=max),
        "kv_usage_metric": next(
            (n for n in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") if n in values), None
        ),
        "running": pick("vllm:num_requests_running"),
        "waiting": pick("vllm:num_requests_waiting"),
        "preemptions": pick("vllm:num_preemptions_total", "vllm:num_preemptions"),
        "prefix_queries": pick("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_hits": pick("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "prompt_tokens": pick("vllm:prompt_tokens_total"),
        "generation_tokens": pick("vllm:generation_tokens_total"),
    }
    hit_rate = None
    if result["prefix_queries"]:
        hit_rate = (result["prefix_hits"] or 0.0) / result["prefix_queries"]
    elif "vllm:gpu_prefix_cache_hit_rate" in values:
        hit_rate = max(values["vllm:gpu_prefix_cache_hit_rate"])
    result["prefix_hit_rate"] = hit_rate
    return result


# ---------------------------------------------------------------------------
# Launch record, samples, settings
# ---------------------------------------------------------------------------


def parse_samples(text_or_list: Any) -> List[Dict[str, float]]:
    """``samples.jsonl`` (text) or a list of dicts -> list sorted by ``t``; bad lines are skipped."""
    if isinstance(text_or_list, list):
        rows = text_or_list
    else:
        rows = []
        for raw in (text_or_list or "").splitlines():
            line = raw.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    out = []
    for row in rows:
        if not isinstance(row, dict) or not _finite(row.get("t")):
            continue
        # a value that is not a finite number (1e999, NaN, a string) is dropped, not plotted
        out.append({k: v for k, v in row.items() if k == "t" or _finite(v) or not isinstance(v, (int, float))})
    return sorted(out, key=lambda r: r["t"])


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def launch_epoch(record: Optional[Dict[str, Any]]) -> Optional[float]:
    """Unix time of the launch start: the launcher's ``launch`` step (exact), else ``started_at``."""
    if not record:
        return None
    for step in record.get("steps") or []:
        if isinstance(step, dict) and step.get("name") == "launch" and isinstance(step.get("at"), (int, float)):
            return float(step["at"])
    return record_time(record, "started_at")


def align_samples(rows: List[Dict[str, Any]], epoch: Optional[float]) -> List[Dict[str, Any]]:
    """Samples with ``t`` in seconds since the launch start.

    The guard writes Unix times; the launcher's ``kv_alloc_t`` and step times count from the
    launch start (the guard starts later, after the lock and the pre-load eviction).
    """
    if not rows or rows[0]["t"] < 1e8:
        return rows
    base = epoch if epoch is not None else rows[0]["t"]
    return [dict(r, t=round(r["t"] - base, 3)) for r in rows]


_FLAG_KEYS = (
    "--gpu-memory-utilization",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--kv-cache-dtype",
    "--kv-cache-memory-bytes",
    "--block-size",
    "--tensor-parallel-size",
)
_BOOL_FLAGS = ("--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill", "--enforce-eager")


def flags_from_argv(argv: Any) -> Dict[str, Any]:
    """The engine flags that matter for memory, from the launcher's argv."""
    flags: Dict[str, Any] = {}
    if not isinstance(argv, list):
        return flags
    args = [str(a) for a in argv]
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in _FLAG_KEYS:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            flags[key[2:].replace("-", "_")] = value
        elif arg in _BOOL_FLAGS:
            flags[arg[2:].replace("-", "_")] = True
    return flags


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


# ---------------------------------------------------------------------------
# Facts
# ---------------------------------------------------------------------------


def gather_facts(evidence: Dict[str, Any], settings: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Parse every piece of evidence into one flat dict the rules read."""
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in (settings or {}).items() if v is not None})
    kernel = parse_kernel_log(evidence.get("dmesg") or "", int(cfg["page_size"]))
    journal = parse_journal(evidence.get("journal") or "")
    metrics = parse_metrics(evidence.get("metrics") or "")
    launch = evidence.get("launch") if isinstance(evidence.get("launch"), dict) else None
    samples = align_samples(parse_samples(evidence.get("samples") or []), launch_epoch(launch))
    meminfo = evidence.get("meminfo") or {}
    mem_total = meminfo.get("MemTotal") or (launch or {}).get("mem_total_bytes")
    runs = journal["runs"]
    last = runs[-1] if runs else None
    # The run the verdict is about: the last one with an OOM line, else the last one.
    failing = next((r for r in reversed(runs) if r["ooms"] or r["killed"]), None)
    focus = failing or last

    started = record_time(launch, "started_at")
    healthy_at = record_time(launch, "healthy_at")
    failed_at = record_time(launch, "failed_at")
    if healthy_at is None and focus and focus.get("healthy_t") is not None:
        healthy_at = focus["healthy_t"]
    launch_healthy = bool(launch and launch.get("healthy_at") is not None) or bool(focus and focus["healthy"])

    def kernel_phase(event: Dict[str, Any]) -> str:
        if event.get("t") is not None and healthy_at is not None:
            return "runtime" if event["t"] > healthy_at else "startup"
        if event.get("t") is not None and started is not None and failed_at is not None:
            return "startup"
        return "runtime" if launch_healthy and failed_at is None else "startup"

    boot_time = evidence.get("boot_time")
    boot_time = float(boot_time) if isinstance(boot_time, (int, float)) and not isinstance(boot_time, bool) else None
    for event in kernel["events"]:
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
        elif (
            failed_at is not None
            and event.get("t") is not None
            and event["t"] > failed_at + float(cfg["after_failure_s"])
        ):
            event["phase"] = "after"
        else:
            event["phase"] = kernel_phase(event)
    k_now = [e for e in kernel["events"] if e["phase"] not in ("before", "after", "unplaced")]

    def kinds(phase: str) -> set:
        return {e["kind"] for e in k_now if e["phase"] == phase}

    # Did this start fail? NV_ERR_NO_MEMORY alone does not say so: published DGX Spark dmesg shows
    # the line during startups that went healthy and at rest, so it only counts next to a failure.
    focus_failed = (
        bool(focus)
        and not focus["healthy"]
        and bool(focus["ooms"] or focus["killed"] or _first(focus, "engine_failed"))
    )
    kernel_killed = bool(kinds("startup") & {"oom_invoked", "oom_killed"})
    startup_failed = bool(launch) and failed_at is not None and healthy_at is None
    startup_failed = startup_failed or focus_failed or (kernel_killed and not launch_healthy)

    # The moment of interest on the timeline: KV allocation, else the failure, else the end.
    kv_alloc_t = (launch or {}).get("kv_alloc_t")
    moment_t = None
    if isinstance(kv_alloc_t, (int, float)):
        moment_t = float(kv_alloc_t)
    elif started is not None and failed_at is not None:
        moment_t = failed_at - started
    at = _sample_at(samples, moment_t)
    cache_unmapped = _cache_unmapped(at)
    peak_cache = max((float(s.get("Cached", 0)) - float(s.get("Mapped", 0)) for s in samples), default=None)
    launch_peak = (launch or {}).get("page_cache_peak_mib")
    guard = (launch or {}).get("guard_status") or evidence.get("guard") or {}
    if isinstance(launch_peak, (int, float)):
        peak_cache = max(peak_cache or 0.0, float(launch_peak) * MIB)

    others = []
    for other in evidence.get("other_launches") or []:
        if not isinstance(other, dict) or not launch or other.get("engine") == launch.get("engine"):
            continue
        overlap = _windows_overlap(launch, other, float(cfg["race_overlap_s"]))
        if overlap:
            others.append({"engine": other.get("engine"), "started_at": other.get("started_at"), "overlap": overlap})

    plan = (launch or {}).get("plan") or evidence.get("plan") or {}
    flags = flags_from_argv((launch or {}).get("argv"))
    stats = [e for r in runs for e in r["events"] if e["kind"] == "stats"]
    return {
        "cfg": cfg,
        "kernel": kernel,
        "kernel_startup": kinds("startup"),
        "kernel_runtime": kinds("runtime"),
        "kernel_events": k_now,
        "journal": journal,
        "focus": focus,
        "metrics": metrics,
        "launch": launch,
        "startup_failed": startup_failed,
        "samples": samples,
        "mem_total": mem_total,
        "moment_t": moment_t,
        "sample_at_moment": at,
        "cache_unmapped_at_moment": cache_unmapped,
        "cache_peak": peak_cache,
        "guard": guard if isinstance(guard, dict) else {},
        "others": others,
        "plan": plan if isinstance(plan, dict) else {},
        "flags": flags,
        "sysctl": evidence.get("sysctl") or {},
        "stats": stats,
        "restarts": journal["restarts"],
    }


# ---------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------


def _lines(*events: Optional[Dict[str, Any]]) -> List[str]:
    out: List[str] = []
    for e in events:
        if e and e.get("line") and e["line"] not in out:
            out.append(e["line"])
    return out


def _startup_failure(f: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Startup-phase failure lines of the focus run (vLLM refusing or failing to size memory)."""
    if not f["startup_failed"]:
        return []
    run = f["focus"]
    if not run or run["healthy"]:
        return []
    return [e for e in run["ooms"] if e["phase"] == "startup"] + list(run["killed"])


def _engine_error_not_memory(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The focus run's first exception when it is not about memory (an unknown architecture, a bad flag)."""
    run = f["focus"]
    errors = [e for e in (run or {}).get("events", []) if e["kind"] == "exception"]
    if errors and not _MEMORY_WORDS.search(errors[0]["line"]) and not (run or {}).get("ooms"):
        return errors[0]
    return None


def _kernel_hit(f: Dict[str, Any]) -> bool:
    """A kernel OOM sign during a start that failed.

    A lone NV_ERR_NO_MEMORY line (the driver logs it at rest and during starts that went healthy)
    does not outweigh the engine's own error when that error is not about memory.
    """
    if not f["startup_failed"]:
        return False
    kinds = f["kernel_startup"]
    if kinds & {"oom_invoked", "oom_killed"}:
        return True
    return "nv_no_memory" in kinds and _engine_error_not_memory(f) is None


def _kernel_lines(f: Dict[str, Any], phase: str, limit: int = 4) -> List[str]:
    order = ("nv_no_memory", "oom_invoked", "sysmem_trace", "uvm_trace", "oom_killed", "oom_file_pages")
    picked: List[str] = []
    for kind in order:
        for e in f["kernel_events"]:
            if e["phase"] == phase and e["kind"] == kind and e["line"] not in picked:
                picked.append(e["line"])
                break
    return picked[:limit]


def _cache_evidence(f: Dict[str, Any]) -> Tuple[bool, List[str], Optional[float]]:
    """Was reclaimable page cache large when the load failed? (yes/no, lines, bytes)."""
    total = f["mem_total"]
    frac = float(f["cfg"]["cache_fraction"])
    lines: List[str] = []
    biggest: Optional[float] = None
    hit = False
    if f["cache_unmapped_at_moment"] is not None and total:
        value = f["cache_unmapped_at_moment"]
        at = f["sample_at_moment"] or {}
        lines.append(
            "samples.jsonl t=%.1fs: Cached-Mapped %s (%.0f%% of MemTotal %s), MemAvailable %s"
            % (
                at.get("t", 0),
                fmt_bytes(value),
                100.0 * value / total,
                fmt_bytes(total),
                fmt_bytes(at.get("MemAvailable")),
            )
        )
        biggest = value
        hit = value >= frac * total
    file_bytes = f["kernel"]["file_bytes_at_oom"]
    if file_bytes is not None and total:
        lines.append(
            "kernel OOM report: file pages %s (%.0f%% of MemTotal) at the kill"
            % (fmt_bytes(file_bytes), 100.0 * file_bytes / total)
        )
        biggest = max(biggest or 0.0, float(file_bytes))
        hit = hit or file_bytes >= frac * total
    if not hit and f["cache_peak"] is not None and total and f["cache_unmapped_at_moment"] is None:
        peak = f["cache_peak"]
        if peak >= frac * total:
            lines.append(
                "launch.json: page_cache_peak %s (%.0f%% of MemTotal) during load"
                % (fmt_bytes(peak), 100.0 * peak / total)
            )
            biggest = peak
            hit = True
    return hit, lines, biggest


def rule_profiling_race(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    run = f["focus"]
    prof = _first(run, "profiling_error")
    engine = (f["launch"] or {}).get("engine", "<engine>")
    fix = [
        "Start one engine at a time: the launcher's start lock / systemd ordering (After=) between the"
        " uma-vllm@ units, so no engine loads or frees memory while another profiles.",
        "Give each engine an explicit KV budget so vLLM skips free-memory profiling: --kv-cache-memory-bytes"
        " <kv_cache_bytes from uma.vllm.vllm_flags> (the planner's budget) instead of relying on"
        " --gpu-memory-utilization.",
    ]
    others = f["others"]
    if prof:
        lines = _lines(prof)
        conf = 0.95
        if others:
            lines.append(
                "launch of engine %r overlapped this one (started %s)" % (others[0]["engine"], others[0]["started_at"])
            )
        return {"confidence": conf, "evidence": lines, "fix": fix, "detail": {"overlapping": others}}
    failures = _startup_failure(f)
    cuda = [e for e in failures if e["kind"] == "cuda_oom" and e.get("other_processes")]
    if others and (failures or _kernel_hit(f)):
        lines = _lines(*failures[:2]) + _kernel_lines(f, "startup", 2)
        for o in others:
            lines.append(
                "launch of engine %r (started %s) overlapped %s's load by %.0f s"
                % (o["engine"], o["started_at"], engine, o["overlap"][1] - o["overlap"][0])
            )
        return {"confidence": 0.92, "evidence": lines, "fix": fix, "detail": {"overlapping": others}}
    if cuda and not f["launch"]:
        return {"confidence": 0.6, "evidence": _lines(*cuda), "fix": fix, "detail": {}}
    return None


def _starvation_fix(f: Dict[str, Any]) -> List[str]:
    guard = f["guard"] or {}
    if guard.get("mode"):
        ran = "it ran in mode %r with %s evictions (peak %s MiB); " % (
            guard.get("mode"),
            guard.get("evictions", "?"),
            guard.get("peak_cache_mib", "?"),
        )
    else:
        ran = "it did not run for this launch; "
    return [
        "Hold the page cache down during the load with the guard (uma.vllm.launch_wrapper): %smode '%s'"
        " (the default) or 'files' with the checkpoint directory as --paths, threshold on Cached minus Mapped."
        % (ran, GUARD_MODE),
        "Evict the checkpoint from the page cache right before the engine starts: the launcher's pre_evict"
        " 'files' (the default; posix_fadvise over model_path, no root, no collateral) needs model_path set;"
        " pre_evict 'drop' (sync, then /proc/sys/vm/drop_caches) also empties every other workload's cache.",
        "Keep vm.min_free_kbytes at the uma.vllm.uma_sysctl size so the kernel reclaims before the driver's"
        " allocation fails (now: %s)." % (f["sysctl"].get("vm.min_free_kbytes", "unknown")),
        "Do not lower gpu_memory_utilization for this: the budget fits, the memory was held by page cache.",
    ]


# Startup failures that page cache held by the kernel can cause on a unified-memory node: the
# driver's allocation fails or cudaMemGetInfo under-reports free memory. vLLM's KV sizing itself
# (kv_insufficient / kv_none / kv_request_over) is computed from the budget, not from free memory.
_CACHE_SENSITIVE = {"startup_free", "cuda_oom", "cuda_error_oom", "unit_result", "exit"}


def rule_page_cache_starvation(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    failures = [e for e in _startup_failure(f) if e["kind"] in _CACHE_SENSITIVE]
    kernel_hit = _kernel_hit(f)
    if not failures and not kernel_hit:
        return None
    cache_hit, cache_lines, cache_bytes = _cache_evidence(f)
    if not cache_hit:
        return None
    if kernel_hit and (f["kernel"]["nvidia_trace"] or f["kernel"]["nv_no_memory"]):
        conf = 0.9
    else:
        conf = 0.85
    lines = _kernel_lines(f, "startup") + _lines(*failures[:2]) + cache_lines
    return {"confidence": conf, "evidence": lines, "fix": _starvation_fix(f), "detail": {"cache_bytes": cache_bytes}}


def rule_admission_refused(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The launcher refused the start before the engine ran (uma_launch.py admit(), exit 75):
    MemAvailable stayed below the plan's startup request."""
    launch = f["launch"] or {}
    adm = launch.get("admission")
    if not isinstance(adm, dict) or adm.get("admitted") is not False:
        return None
    short = int(adm.get("short_bytes") or 0)
    need = int(adm.get("need_bytes") or 0)
    avail = int(adm.get("mem_available_bytes") or 0)
    evidence = [
        "launch.json: admission refused (exit %s): MemAvailable %s below the startup request %s (%s), short by %s "
        "after evicting the model's cache and waiting %s s"
        % (
            launch.get("exit_code"),
            fmt_bytes(avail),
            fmt_bytes(need),
            adm.get("need_source", "plan"),
            fmt_bytes(short),
            adm.get("waited_s"),
        )
    ]
    fix = [
        "Free %s on the node before the start: stop another engine or process holding memory "
        "(the launch lock already serialises engine loads)." % fmt_bytes(short),
        "Or re-plan this engine smaller with uma.vllm.vllm_flags (lower max_model_len / max_num_seqs, or "
        "kv_cache_dtype fp8) so its startup request fits what the node has.",
    ]
    return {
        "confidence": 0.95,
        "evidence": evidence,
        "fix": fix,
        "detail": {"need_bytes": need, "mem_available_bytes": avail, "short_bytes": short},
    }


def rule_startup_oom(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    # The profiling assertion is the race's, not the budget's.
    failures = [e for e in _startup_failure(f) if e["kind"] != "profiling_error"]
    kernel_hit = _kernel_hit(f)
    if not failures and not kernel_hit:
        return None
    flags = f["flags"]
    plan = f["plan"]
    fix: List[str] = []
    conf = 0.7
    insufficient = next((e for e in failures if e["kind"] == "kv_insufficient"), None)
    none_left = next((e for e in failures if e["kind"] == "kv_none"), None)
    available = _last(f["focus"], "kv_available")
    over_req = next((e for e in failures if e["kind"] in ("kv_request_over", "startup_free")), None)
    lines = _lines(insufficient, none_left, over_req)
    if insufficient:
        conf = 0.9
        est = insufficient.get("estimated_max_len")
        fix.append(
            "The KV cache cannot hold one request of max_model_len %d (needs %s, has %s): set --max-model-len %s"
            " or re-plan with uma.vllm.vllm_flags and max_model_len <= %s."
            % (
                insufficient["max_model_len"],
                fmt_bytes(insufficient["needed_bytes"]),
                fmt_bytes(insufficient["available_bytes"]),
                est if est else "lower",
                est if est else "the planner's kv_tokens",
            )
        )
        fix.append("Or halve the bytes per token with --kv-cache-dtype fp8 (if the model tolerates it).")
    if none_left or (available and available.get("available_bytes", 0) <= 0):
        conf = 0.9
        lines += _lines(available)
        fix.append(
            "Weights and activations use the whole budget (no memory left for KV blocks): raise"
            " --gpu-memory-utilization only if the node has headroom (re-plan with uma.vllm.vllm_flags),"
            " else a quantized checkpoint or a smaller --max-num-batched-tokens (smaller activation peak)."
        )
    if over_req:
        conf = max(conf, 0.85)
        want = over_req.get("requested_bytes")
        have = over_req.get("available_bytes", over_req.get("free_bytes"))
        total = over_req.get("total_bytes") or f["mem_total"]
        util = None
        if have and total:
            util = max(0.05, round((have - 0.05 * total) / total, 2))
        explicit = over_req["kind"] == "kv_request_over" and (
            "kv_cache_memory_bytes" in f["flags"] or "VLLM_CPU_KVCACHE_SPACE" in over_req["line"]
        )
        if explicit or (over_req["kind"] == "kv_request_over" and "requested_total_bytes" not in over_req):
            # The KV size was given explicitly (--kv-cache-memory-bytes / VLLM_CPU_KVCACHE_SPACE).
            fix.append(
                "The KV cache asked for (%s) is more than the memory available (%s): set --kv-cache-memory-bytes"
                " (VLLM_CPU_KVCACHE_SPACE on the CPU backend) to at most %s, or re-plan with uma.vllm.vllm_flags"
                " (its kv_cache_bytes)." % (fmt_bytes(want), fmt_bytes(have), fmt_bytes(max(0.0, 0.9 * (have or 0))))
            )
        else:
            fix.append(
                "The budget (%s) is larger than the memory free at start (%s): lower --gpu-memory-utilization%s,"
                " or re-plan with uma.vllm.vllm_flags."
                % (fmt_bytes(want), fmt_bytes(have), " to <= %.2f" % util if util else "")
            )
    cuda = [e for e in failures if e["kind"] in ("cuda_oom", "cuda_error_oom")]
    if over_req and over_req["kind"] == "startup_free" and _cache_evidence(f)[0]:
        conf = 0.6  # the budget may fit: page cache held the memory (see page_cache_starvation)
    if cuda or kernel_hit or [e for e in failures if e["kind"] in ("unit_result", "exit")]:
        lines += _lines(*cuda[:1]) + _kernel_lines(f, "startup", 3)
        lines += _lines(*[e for e in failures if e["kind"] in ("unit_result", "exit")][:1])
        budget = _plan_budget(f)
        if budget:
            lines.append(budget["line"])
            if budget["over"]:
                conf = max(conf, 0.85)
        if not (insufficient or none_left or over_req) and _cache_evidence(f)[0]:
            conf = min(conf, 0.6)
        if not fix:
            util = flags.get("gpu_memory_utilization") or plan.get("gpu_memory_utilization")
            fix.append(
                "Weights + KV cache + activations exceeded the memory that was really there: lower"
                " --gpu-memory-utilization%s, or re-plan with uma.vllm.vllm_flags (it leaves reserve_bytes"
                " for the OS) and apply its flags." % (" (now %s)" % util if util else "")
            )
    if not lines:
        lines = _lines(*failures[:2])
    if not fix:
        fix.append(
            "The engine died while sizing or allocating memory at start: lower --gpu-memory-utilization or"
            " re-plan with uma.vllm.vllm_flags and apply its flags."
        )
    return {"confidence": conf, "evidence": lines, "fix": fix, "detail": {}}


def _plan_budget(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    plan = f["plan"]
    total = f["mem_total"]
    if not plan or not total:
        return None
    parts = [plan.get(k) for k in ("weights_bytes", "kv_cache_bytes", "activation_reserve_bytes")]
    if not all(isinstance(p, (int, float)) for p in parts):
        return None
    need = float(sum(parts))
    first = f["samples"][0] if f["samples"] else None
    have = float(first["MemAvailable"]) if first and "MemAvailable" in first else float(total)
    over = need > have
    return {
        "over": over,
        "line": "plan: weights %s + KV %s + activations %s = %s vs MemAvailable at start %s%s"
        % (
            fmt_bytes(parts[0]),
            fmt_bytes(parts[1]),
            fmt_bytes(parts[2]),
            fmt_bytes(need),
            fmt_bytes(have),
            " (over)" if over else "",
        ),
    }


def _runtime_ooms(f: Dict[str, Any]) -> List[Dict[str, Any]]:
    run = f["focus"]
    found = [e for e in (run["ooms"] if run else []) if e["phase"] == "runtime"]
    if run and run["healthy"]:
        found += run["killed"]
    return found


def _stats_before(run: Optional[Dict[str, Any]], event: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if not run:
        return None
    return next((e for e in reversed(run["events"]) if e["kind"] == "stats" and e["n"] < event["n"]), None)


def _under_load(stats: Optional[Dict[str, Any]], min_prompt_tps: float = DEFAULTS["load_prompt_tps"]) -> bool:
    """Requests queued, or prompts arriving fast enough to make a burst (not any non-zero trickle)."""
    return bool(stats) and (stats.get("waiting", 0) > 0 or stats.get("prompt_tps", 0) >= min_prompt_tps)


_FRAGMENT_FIX = [
    "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the engine's environment (the launcher's env),"
    " so freed blocks can be reused for other sizes; verify the next load on GB10 (one published A/B"
    " saw NV_ERR_NO_MEMORY during checkpoint load with it).",
    "Until then restart the engine before the fragmentation builds up (a planned restart window) and keep"
    " --max-num-seqs modest so request shapes vary less.",
]


def rule_fragmentation(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    cuda = [e for r in f["journal"]["runs"] for e in r["ooms"] if e["kind"] == "cuda_oom"]
    fragmented = []
    for e in cuda:
        reserved = e.get("reserved_unallocated_bytes")
        if reserved is None:
            continue
        if reserved >= float(f["cfg"]["fragment_bytes"]) or reserved >= max(e.get("tried_bytes") or 0, 256 * MIB):
            fragmented.append(e)
    if fragmented:
        e = fragmented[-1]
        lines = _lines(e)
        lines.append(
            "reserved but unallocated %s >= the failed request %s: the memory was there, in the wrong pieces"
            % (fmt_bytes(e["reserved_unallocated_bytes"]), fmt_bytes(e.get("tried_bytes")))
        )
        return {"confidence": 0.9, "evidence": lines, "fix": list(_FRAGMENT_FIX), "detail": {}}
    runs = [
        r
        for r in f["journal"]["runs"]
        if r["healthy"] and (r["killed"] or [e for e in r["ooms"] if e["phase"] == "runtime"])
    ]
    if len(runs) < int(f["cfg"]["chronic_runs"]):
        return None
    loaded = False
    lines = ["%d runs served healthy, then died of OOM (restart counter %d)" % (len(runs), f["restarts"])]
    for r in runs[-2:]:
        dead = ([e for e in r["ooms"] if e["phase"] == "runtime"] or r["killed"])[0]
        before = _stats_before(r, dead)
        loaded = loaded or _under_load(before, float(f["cfg"]["load_prompt_tps"]))
        if r.get("healthy_t") is not None and dead.get("t") is not None:
            lines.append("%s (%.1f h after healthy)" % (dead["line"], (dead["t"] - r["healthy_t"]) / 3600.0))
        else:
            lines += _lines(dead)
        lines += _lines(before)
    return {"confidence": 0.65 if loaded else 0.8, "evidence": lines, "fix": list(_FRAGMENT_FIX), "detail": {}}


def rule_runtime_burst(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    ooms = _runtime_ooms(f)
    k_runtime = f["kernel_runtime"] & {"oom_invoked", "oom_killed"}
    if not ooms and not k_runtime:
        return None
    run = f["focus"]
    lines = _lines(*ooms[:1]) + _kernel_lines(f, "runtime", 3) + _lines(*ooms[1:2])
    before = _stats_before(run, ooms[0]) if ooms else (f["stats"][-1] if f["stats"] else None)
    conf = 0.75
    if before:
        lines.append(before["line"])
        if _under_load(before, float(f["cfg"]["load_prompt_tps"])):
            conf = 0.85
    flags = f["flags"]
    mnbt = flags.get("max_num_batched_tokens")
    try:
        half = max(512, int(mnbt) // 2) if mnbt else None
    except ValueError:
        half = None
    fix = [
        "Bound the tokens one step may process: --max-num-batched-tokens %s (chunked prefill splits long prompts)"
        % ("%d (now %s)" % (half, mnbt) if half else "2048 or lower"),
        "Lower --max-num-seqs%s and cap prompts with --max-model-len, so a burst of long prompts cannot claim"
        " more activation memory than the plan's activation_reserve_bytes."
        % (" (now %s)" % flags["max_num_seqs"] if flags.get("max_num_seqs") else ""),
        "Re-plan with uma.vllm.vllm_flags with the new max_num_batched_tokens so gpu_memory_utilization leaves"
        " the activation reserve outside the KV cache.",
    ]
    return {"confidence": conf, "evidence": lines, "fix": fix, "detail": {}}


def rule_prefix_cache_pressure(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    cfg = f["cfg"]
    m = f["metrics"]
    usage = m.get("kv_usage")
    waiting = m.get("waiting")
    preempt = m.get("preemptions")
    hit = m.get("prefix_hit_rate")
    source = "metrics"
    last_stats = f["stats"][-1] if f["stats"] else None
    if usage is None and last_stats:
        usage = last_stats.get("kv_usage")
        waiting = last_stats.get("waiting")
        preempt = last_stats.get("preemptions")
        hit = last_stats.get("prefix_hit")
        source = "log"
    if usage is None or usage < float(cfg["kv_usage_high"]):
        return None
    if not (waiting or preempt):
        return None
    lines = []
    if source == "metrics":
        lines.append("%s = %.2f" % (m.get("kv_usage_metric"), usage))
        if waiting is not None:
            lines.append(
                "vllm:num_requests_waiting = %g, vllm:num_requests_running = %g" % (waiting, m.get("running") or 0)
            )
        if preempt:
            lines.append("vllm:num_preemptions_total = %g" % preempt)
        if hit is not None:
            lines.append("prefix cache hit rate = %.2f (hits/queries)" % hit)
    else:
        lines.append(last_stats["line"])
    lines += _lines(*[e for r in f["journal"]["runs"] for e in r["events"] if e["kind"] == "preempted_v0"][:1])
    conf = 0.7 + (0.1 if preempt else 0.0)
    fix = [
        "Give the engine more KV blocks: re-plan with uma.vllm.vllm_flags for a larger kv_cache_bytes (or a"
        " smaller max_model_len), or --kv-cache-dtype fp8 to double the tokens per byte.",
        "Lower --max-num-seqs so admitted requests fit the cache instead of being preempted and recomputed.",
    ]
    if hit is not None and hit < float(cfg["prefix_hit_low"]):
        fix.append(
            "The prefix-cache hit rate is %.0f%%: cached prefixes are evicted before reuse; route a session's"
            " requests to the same engine, or turn it off with --no-enable-prefix-caching if prompts share"
            " nothing." % (100 * hit)
        )
    return {"confidence": conf, "evidence": lines, "fix": fix, "detail": {"kv_usage": usage, "hit_rate": hit}}


# The rule table: class id -> rule. Each rule returns None or a finding with
# confidence (0-1), the evidence lines that decided it and the fix.
RULES: List[Tuple[str, Callable[[Dict[str, Any]], Optional[Dict[str, Any]]]]] = [
    ("admission_refused", rule_admission_refused),
    ("profiling_race", rule_profiling_race),
    ("page_cache_starvation", rule_page_cache_starvation),
    ("startup_oom", rule_startup_oom),
    ("fragmentation", rule_fragmentation),
    ("runtime_burst", rule_runtime_burst),
    ("prefix_cache_pressure", rule_prefix_cache_pressure),
]


def classify(facts: Dict[str, Any]) -> Dict[str, Any]:
    findings = []
    for class_id, rule in RULES:
        found = rule(facts)
        if found:
            found = dict(found)
            found["class"] = class_id
            found["title"] = TITLES[class_id]
            found["confidence"] = round(float(found["confidence"]), 2)
            findings.append(found)
    order = {c: i for i, c in enumerate(CLASSES)}
    findings.sort(key=lambda x: (-x["confidence"], order[x["class"]]))
    if findings:
        return {"verdict": findings[0], "others": findings[1:]}
    checked = []
    if facts["kernel"]["events"] or facts["journal"]["runs"] or facts["metrics"]["present"] or facts["launch"]:
        checked.append("no OOM line in the kernel log or the engine journal, KV cache not under pressure")
    fix = ["Nothing to change. If the engine still fails, collect its journal since the failure and run again."]
    focus = facts["focus"]
    if facts["startup_failed"] or (focus and not focus["healthy"] and _first(focus, "engine_failed")):
        # The start failed, but not for memory: show the engine's own first error.
        errors = [e for e in (focus or {}).get("events", []) if e["kind"] == "exception"]
        if errors:
            checked.append("the start failed for another reason: %s" % errors[0]["line"])
            fix = ["Not an out-of-memory case: fix the engine's own error shown above (first exception of the run)."]
    verdict = {
        "class": "none",
        "title": TITLES["none"],
        "confidence": 0.5 if not checked else 0.8,
        "evidence": checked or ["no evidence was available to read"],
        "fix": fix,
        "detail": {},
    }
    return {"verdict": verdict, "others": []}


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


# ---------------------------------------------------------------------------
# The engine watchdog's records (uma_watchdog.py: <state_dir>/watchdog/<engine>/)
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


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
    wd = result.get("watchdog")
    if wd:
        out += ["## Engine watchdog", ""]
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
    if result["others"]:
        out += ["## Other findings", "", "| class | confidence | first evidence |", "| --- | --- | --- |"]
        for o in result["others"]:
            first = o["evidence"][0] if o["evidence"] else ""
            out.append("| `%s` | %.2f | %s |" % (o["class"], o["confidence"], _md_escape(first[:160])))
        out.append("")
    out += ["## Settings in force", "", "| setting | value |", "| --- | --- |"]
    settings = result["settings"]
    for group in ("flags", "plan", "sysctl", "guard"):
        for key, value in sorted((settings.get(group) or {}).items()):
            shown = value
            if key.endswith("_bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
                shown = "%s (%s)" % (value, fmt_bytes(value))
            out.append("| %s.%s | %s |" % (group, key, _md_escape(shown)))
    out += ["", "## What was read", "", "| source | value |", "| --- | --- |"]
    for key, value in s.items():
        if value is not None:
            shown = fmt_bytes(value) if key.endswith("_bytes") else value
            out.append("| %s | %s |" % (key, _md_escape(shown)))
    out.append("")
    return "\n".join(out)
