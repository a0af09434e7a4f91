# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OOM diagnosis, step 1: the parsers that turn the node's raw evidence into events and values.

Kernel log (``dmesg`` / ``journalctl -k``), the engine's journal (launcher, vLLM and systemd
lines, split into runs), vLLM's ``/metrics`` text, the guard's ``samples.jsonl``, the
launcher's ``launch.json`` (times, argv flags). Pure functions over strings and dicts: nothing
here reads files (``_diagnose_node`` does). The rules read what these return through
``_diagnose_facts.gather_facts``; the package's entry point is ``_diagnose.diagnose``.
"""

from __future__ import annotations

import ast
import datetime
import json
import math
import re
import shlex
from typing import Any, Callable, Dict, List, Optional, Tuple

GIB = 1024**3
MIB = 1024**2

_REL_TIME_RE = re.compile(r"^\[\s*(\d+\.\d+)\]")

# ---------------------------------------------------------------------------
# Small parsers
# ---------------------------------------------------------------------------

_UNITS = {"B": 1, "bytes": 1, "KiB": 1024, "MiB": MIB, "GiB": GIB, "TiB": 1024**4, "kB": 1024, "KB": 1024}


def size_to_bytes(text: str) -> Optional[int]:
    """'14.75 GiB' -> bytes ('0 bytes': PyTorch's format for sizes up to 1 KiB); None when not a size."""
    m = re.match(r"\s*(-?[\d.]+)\s*([KMGT]iB|kB|KB|B|bytes)\s*$", text or "")
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
# the kill's context line (kernel >= 4.19): which cgroup the killed task was in
_K_OOM_TASK = re.compile(r"oom-kill:\S*?task_memcg=([^,]*),task=([^,]*),pid=(\d+)")
_K_UVM = re.compile(r"\[nvidia_uvm\]|\buvm_\w+|phys_mem_allocate")
_K_SYSMEM = re.compile(r"sysmemAllocResources|_memdescAllocInternal|memdescAlloc\w*|\[nvidia\]")
_K_NODE_FILE = re.compile(r"Node \d+ .*?active_file:(\d+)kB inactive_file:(\d+)kB")
_K_PAGES_FILE = re.compile(r"\bactive_file:(\d+) inactive_file:(\d+)\b(?!kB)")


def parse_kernel_log(text: str, page_size: int = 4096) -> Dict[str, Any]:
    """Events of interest in a kernel log (``dmesg``, ``dmesg -T`` or ``journalctl -k``)."""
    events: List[Dict[str, Any]] = []
    memcg_of: Dict[int, str] = {}
    for number, raw in enumerate((text or "").splitlines()):
        line = raw.rstrip()
        if not line:
            continue
        task = _K_OOM_TASK.search(line)
        if task:
            memcg_of[int(task.group(3))] = task.group(1)
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
            if int(m.group(2)) in memcg_of:  # the context line comes just before the kill line
                data["memcg"] = memcg_of[int(m.group(2))]
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
            r"CUDA out of memory\. Tried to allocate ([\d.]+ (?:[KMGT]?i?B|bytes))\.(?: GPU (\d*) ?has a total"
            r" capacity of ([\d.]+ (?:[KMGT]iB|bytes)) of which ([\d.]+ (?:[KMGT]iB|bytes)) is free\.)?"
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
    # vLLM's own record of its arguments (entrypoints/utils.py log_non_default_args), a Python dict repr
    ("engine_args", re.compile(r"non-default args: (\{.*\})\s*$")),
    ("preempted_v0", re.compile(r"preempted by PreemptionMode\.\w+ mode because there is not enough KV cache space")),
    # The launcher's first line, or systemd starting the unit (the only start line of a unit run without it)
    ("run_start", re.compile(r"\[vllm-uma-launch [^\]]+\] launch t=|systemd\[\d+\]: Started uma-vllm@")),
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
_CUDA_RESERVED = re.compile(r"and ([\d.]+ (?:[KMGT]iB|bytes)) is reserved by PyTorch but unallocated")
_CUDA_ALLOCATED = re.compile(r"Of the allocated memory ([\d.]+ (?:[KMGT]iB|bytes)) is allocated by PyTorch")
_CUDA_OTHER_PROC = re.compile(r"Process (\d+) has ([\d.]+ (?:[KMGT]iB|bytes)) memory in use")

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
    elif kind == "engine_args":
        data = {"args": _literal_args(m.group(1))}
    elif kind == "run_start":
        argv = _started_argv(line)
        if argv:
            data = {"argv": argv}
    elif kind == "restart":
        data = {"counter": int(m.group(1))}
    elif kind == "exit":
        data = {"code": m.group(1), "status": m.group(2)}
    elif kind == "unit_result":
        data = {"result": m.group(1)}
    return data


def _literal_args(text: str) -> Dict[str, Any]:
    """vLLM's ``non-default args: {...}`` as a dict of plain values; anything else is left out.

    ``ast.literal_eval`` evaluates literals only (no names, calls or attribute access); a
    value that is not a literal (e.g. an object's repr) makes the whole line unreadable, and
    then the diagnosis simply has no flags from it.
    """
    if len(text) > 20000:
        return {}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, (str, int, float, bool)) or v is None}


_STARTED_CMD = re.compile(r"systemd\[\d+\]: Started uma-vllm@\S+ - (/\S+ .*?)\.?\s*$")


def _started_argv(line: str) -> Optional[List[str]]:
    """The command of a transient unit (``systemd-run`` describes the unit by its command line)."""
    m = _STARTED_CMD.search(line)
    if not m:
        return None
    try:
        return shlex.split(m.group(1))
    except ValueError:
        return None


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


def _new_run(events: List[Dict[str, Any]], kind: str, ended: bool) -> bool:
    """Does a line of ``kind`` start a new run after ``events``?

    After the run ended, any line that does not end it too; a start line after anything but start
    lines (systemd's ``Started`` then the launcher's first line are one start); a second ``Main
    process exited`` (a process exits once: a start whose own lines matched nothing, e.g. killed
    while loading, must not be merged into the run before it).
    """
    if ended and kind not in _RUN_ENDERS:
        return True
    if kind == "run_start":
        return any(e["kind"] != "run_start" for e in events)
    return ended and kind == "exit" and any(e["kind"] == "exit" for e in events)


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
            if _new_run(current["events"], kind, ended):
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


# vLLM's argument names (``non-default args``) for the flags above
_ARG_NAMES = (*(k[2:].replace("-", "_") for k in _FLAG_KEYS), "enable_prefix_caching", "enforce_eager")


def flags_from_args(args: Any) -> Dict[str, Any]:
    """The same flags from vLLM's own ``non-default args`` record (values as text, like the argv's)."""
    if not isinstance(args, dict):
        return {}
    out: Dict[str, Any] = {}
    for name in _ARG_NAMES:
        if name in args and args[name] is not None:
            value = args[name]
            out[name] = value if isinstance(value, bool) else str(value)
    return out


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
