# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OOM diagnosis, step 3: the rules that turn the facts into findings, and the verdict.

Each ``rule_<class>`` reads the facts of ``_diagnose_facts.gather_facts`` and returns None
or a finding: a confidence (0-1), the evidence lines that decided it and the fix.
:data:`RULES` is the table; :func:`classify` runs it and ranks the findings.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.diagnose.facts import DEFAULTS
from ansible_collections.uma.vllm.plugins.module_utils.diagnose.parse import MIB, _first, _last, fmt_bytes
from ansible_collections.uma.vllm.plugins.module_utils.node.guard.config import DEFAULT_MODE

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

_MEMORY_WORDS = re.compile(r"memory|OutOfMemory|NO_MEMORY|KV cache|oom|CUDA error", re.IGNORECASE)


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
    MemAvailable (or, ``memory: gpu``, a GPU's free memory) stayed below the plan's startup request."""
    launch = f["launch"] or {}
    adm = launch.get("admission")
    if not isinstance(adm, dict) or adm.get("admitted") is not False:
        return None
    short = int(adm.get("short_bytes") or 0)
    need = int(adm.get("need_bytes") or 0)
    if adm.get("memory") == "gpu":
        return _gpu_admission_refused(launch, adm, need, short)
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


def _gpu_admission_refused(launch: Dict[str, Any], adm: Dict[str, Any], need: int, short: int) -> Dict[str, Any]:
    """admission_refused on a discrete GPU (node/launch/admission.py): the GPU's free memory, not MemAvailable."""
    gpus = [g for g in adm.get("gpus") or [] if isinstance(g, dict)]
    gpu = next((g for g in gpus if g.get("index") == adm.get("short_gpu")), gpus[0] if gpus else {})
    index = gpu.get("index", adm.get("short_gpu", "?"))
    free = int(gpu.get("free_bytes") or 0)
    evidence = [
        "launch.json: admission refused (exit %s): GPU %s has %s free of %s, below the startup request %s per GPU "
        "(%s), short by %s after waiting %s s"
        % (launch.get("exit_code"), index, fmt_bytes(free), fmt_bytes(int(gpu.get("total_bytes") or 0)),
           fmt_bytes(need), adm.get("need_source", "plan"), fmt_bytes(short), adm.get("waited_s"))
    ]  # fmt: skip
    fix = [
        "Free %s of GPU memory on GPU %s before the start: stop the other process on that GPU (see nvidia-smi; "
        "the launch lock already serialises engine loads)." % (fmt_bytes(short), index),
        "Or re-plan this engine smaller with uma.vllm.vllm_flags (a lower gpu_memory_utilization or "
        "kv_cache_memory_bytes) so its startup request fits what the GPU has free.",
    ]
    detail = {"need_bytes": need, "gpu_index": index, "gpu_free_bytes": free, "short_bytes": short}
    return {"confidence": 0.95, "evidence": evidence, "fix": fix, "detail": detail}


def _max_model_len_fixes(insufficient: Dict[str, Any]) -> List[str]:
    """The fixes when the KV cache cannot hold one request of max_model_len."""
    est = insufficient.get("estimated_max_len")
    return [
        "The KV cache cannot hold one request of max_model_len %d (needs %s, has %s): set --max-model-len %s"
        " or re-plan with uma.vllm.vllm_flags and max_model_len <= %s."
        % (
            insufficient["max_model_len"],
            fmt_bytes(insufficient["needed_bytes"]),
            fmt_bytes(insufficient["available_bytes"]),
            est if est else "lower",
            est if est else "the planner's kv_tokens",
        ),
        "Or halve the bytes per token with --kv-cache-dtype fp8 (if the model tolerates it).",
    ]


_NO_KV_LEFT_FIX = (
    "Weights and activations use the whole budget (no memory left for KV blocks): raise"
    " --gpu-memory-utilization only if the node has headroom (re-plan with uma.vllm.vllm_flags),"
    " else a quantized checkpoint or a smaller --max-num-batched-tokens (smaller activation peak)."
)


def _over_request_fix(f: Dict[str, Any], over_req: Dict[str, Any]) -> str:
    """The fix when vLLM asked for more than was there (an explicit KV size, or the utilization's budget)."""
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
        return (
            "The KV cache asked for (%s) is more than the memory available (%s): set --kv-cache-memory-bytes"
            " (VLLM_CPU_KVCACHE_SPACE on the CPU backend) to at most %s, or re-plan with uma.vllm.vllm_flags"
            " (its kv_cache_bytes)." % (fmt_bytes(want), fmt_bytes(have), fmt_bytes(max(0.0, 0.9 * (have or 0))))
        )
    return (
        "The budget (%s) is larger than the memory free at start (%s): lower --gpu-memory-utilization%s,"
        " or re-plan with uma.vllm.vllm_flags."
        % (fmt_bytes(want), fmt_bytes(have), " to <= %.2f" % util if util else "")
    )


def _allocation_failure(
    f: Dict[str, Any], cuda: List[Dict[str, Any]], exits: List[Dict[str, Any]], conf: float, sized: bool
) -> Tuple[List[str], float]:
    """Evidence lines and confidence when an allocation failed or the engine was killed at start.

    ``sized``: vLLM's own KV sizing already explained the failure (then page cache does not
    lower the confidence).
    """
    lines = _lines(*cuda[:1]) + _kernel_lines(f, "startup", 3)
    lines += _lines(*exits[:1])
    budget = _plan_budget(f)
    if budget:
        lines.append(budget["line"])
        if budget["over"]:
            conf = max(conf, 0.85)
    if not sized and _cache_evidence(f)[0]:
        conf = min(conf, 0.6)
    return lines, conf


def _lower_utilization_fix(f: Dict[str, Any]) -> str:
    kv = f["flags"].get("kv_cache_memory_bytes")
    if kv:
        # vLLM takes an explicit KV size as it is: the utilization does not size the cache then
        return (
            "Weights + KV cache + activations exceeded the memory that was really there, and the KV cache was"
            " given explicitly (--kv-cache-memory-bytes %s), which --gpu-memory-utilization does not size:"
            " lower --kv-cache-memory-bytes, or re-plan with uma.vllm.vllm_flags (it sizes the KV cache from"
            " what is left after weights and reserve_bytes) and apply its flags." % kv
        )
    util = f["flags"].get("gpu_memory_utilization") or f["plan"].get("gpu_memory_utilization")
    return (
        "Weights + KV cache + activations exceeded the memory that was really there: lower"
        " --gpu-memory-utilization%s, or re-plan with uma.vllm.vllm_flags (it leaves reserve_bytes"
        " for the OS) and apply its flags." % (" (now %s)" % util if util else "")
    )


# cgroups of the engine itself (the native unit, a container's scope: which engine a scope runs is not
# in the kernel line, so a kill there is never called another process's)
_ENGINE_CGROUPS = ("uma-vllm@", "docker-", "libpod-", "/docker/", "/machine.slice/")


def _outsiders_killed(f: Dict[str, Any]) -> List[Dict[str, Any]]:
    """OOM kills during the start of processes outside the engine's unit (the kernel named their cgroup)."""
    return [
        e for e in f["kernel_events"]
        if e["phase"] == "startup" and e["kind"] == "oom_killed" and e.get("memcg")
        and not any(mark in e["memcg"] for mark in _ENGINE_CGROUPS)
    ]  # fmt: skip


def _outsider_fix(killed: List[Dict[str, Any]]) -> str:
    names = ", ".join(
        "pid %d (%s) in %s%s" % (e["pid"], e.get("process"), e["memcg"],
                                 ", %s anonymous" % fmt_bytes(e["anon_rss_bytes"]) if e.get("anon_rss_bytes") else "")
        for e in killed[:3]
    )  # fmt: skip
    return (
        "A process outside the engine held memory while it started, and the OOM killer killed it too: %s."
        " Stop it before the engine starts (or keep it to another node), or count its memory in the plan:"
        " the launcher's admission waits for MemAvailable to cover the startup request, and"
        " uma.vllm.vllm_flags plans with reserve_bytes for memory that is not the engine's." % names
    )


def rule_startup_oom(f: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    # The profiling assertion is the race's, not the budget's.
    failures = [e for e in _startup_failure(f) if e["kind"] != "profiling_error"]
    kernel_hit = _kernel_hit(f)
    if not failures and not kernel_hit:
        return None
    fix: List[str] = []
    conf = 0.7
    insufficient = next((e for e in failures if e["kind"] == "kv_insufficient"), None)
    none_left = next((e for e in failures if e["kind"] == "kv_none"), None)
    available = _last(f["focus"], "kv_available")
    over_req = next((e for e in failures if e["kind"] in ("kv_request_over", "startup_free")), None)
    lines = _lines(insufficient, none_left, over_req)
    if insufficient:
        conf = 0.9
        fix += _max_model_len_fixes(insufficient)
    if none_left or (available and available.get("available_bytes", 0) <= 0):
        conf = 0.9
        lines += _lines(available)
        fix.append(_NO_KV_LEFT_FIX)
    if over_req:
        conf = max(conf, 0.85)
        fix.append(_over_request_fix(f, over_req))
    cuda = [e for e in failures if e["kind"] in ("cuda_oom", "cuda_error_oom")]
    if over_req and over_req["kind"] == "startup_free" and _cache_evidence(f)[0]:
        conf = 0.6  # the budget may fit: page cache held the memory (see page_cache_starvation)
    exits = [e for e in failures if e["kind"] in ("unit_result", "exit")]
    if cuda or kernel_hit or exits:
        more, conf = _allocation_failure(f, cuda, exits, conf, sized=bool(insufficient or none_left or over_req))
        lines += more
        outsiders = _outsiders_killed(f)
        had_fix = bool(fix)
        if outsiders:
            lines += [e["line"] for e in outsiders[:2] if e["line"] not in lines]
            fix.append(_outsider_fix(outsiders))
        if not had_fix:
            fix.append(_lower_utilization_fix(f))
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
