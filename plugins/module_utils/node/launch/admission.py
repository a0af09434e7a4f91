# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launcher's memory admission: before any weight is read, the memory the start needs must be free.

vLLM's startup check compares gpu_memory_utilization x the memory it sees with the free memory
(torch.cuda.mem_get_info(), taken after the process's own CUDA context). On a unified-memory node
that free memory is the host's MemAvailable; on a discrete GPU it is the card's. So:

- **host** (a unified-memory node, the default): the node's MemAvailable must cover every rank's
  startup request (:meth:`StartPlan.host_need`). Short, the model's files are evicted again and the
  launcher waits up to ``admission_wait_s`` for memory a stopping engine or another load still holds;
  still short, it refuses with the numbers (exit 75, ``admission`` in launch.json);
- **gpu** (``admission_memory: gpu`` or the plan's ``unified_memory: false``): each of the engine's
  GPUs (``gpus_per_node``) must have one rank's request plus the CUDA context free in nvidia-smi
  (:meth:`StartPlan.gpu_need`); it waits without evicting (the page cache frees no GPU memory).
  Whatever keeps the GPUs from being read admits unchecked, with the reason logged and recorded.

The numbers come from the plan contract (``node/base/plan.py``), read once by the config's
validator (``config["_plan"]``). Also here: the guard's MemFree line, which is the same request.
Stdlib only; shipped in the node package.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..base.common import UmaError, read_meminfo
from ..base.plan import GIB_F, StartPlan
from .node import _fmt, evict_files

NVIDIA_SMI = ("nvidia-smi", "--query-gpu=index,uuid,memory.free,memory.total", "--format=csv,noheader,nounits")
NVIDIA_SMI_TIMEOUT_S = 5.0
MIB = 1 << 20
_GPU_ROW = re.compile(r"^\s*([0-9]+)\s*,\s*([^,\s][^,]*?)\s*,\s*([0-9]+)\s*,\s*([0-9]+)\s*$")
NOT_CHECKED = "the GPU's free memory is not checked (vLLM's own startup check still runs)"


def plan_of(config: Mapping[str, Any]) -> Optional[StartPlan]:
    """The engine's plan as the config's validator read it (``_plan``); a config made by hand
    (without ``validate``) has its ``plan`` read here, with the same checks."""
    if "_plan" in config:
        return config["_plan"]
    return StartPlan.read(config.get("plan"))


def memory_mode(config: Mapping[str, Any]) -> Tuple[str, str]:
    """host or gpu, and why: admission_memory host or gpu as given; auto is gpu where the plan
    says ``unified_memory: false`` (a discrete GPU), else host (a unified-memory node, or a plan
    without the key: the published behaviour)."""
    mode = config.get("admission_memory") or "auto"
    if mode != "auto":
        return mode, "admission_memory %s" % mode
    plan = plan_of(config)
    return plan.admission_memory() if plan is not None else ("host", "auto: no unified_memory in the plan")


def host_need(config: Mapping[str, Any]) -> Tuple[Optional[int], str]:
    """Host mode: bytes the start needs free, and from what: admission_request_bytes, else the plan's startup
    request (what vLLM's check compares with MemAvailable: ceil(total x gmu)) for every rank on the node."""
    given = config.get("admission_request_bytes")
    if given:
        return int(given), "admission_request_bytes"
    plan = plan_of(config)
    return plan.host_need() if plan is not None else (None, "no startup request in the plan")


def gpu_need(config: Mapping[str, Any]) -> Tuple[Optional[int], str]:
    """The free bytes each of the engine's GPUs needs, and from what: ``admission_request_bytes`` where
    given (the whole need, no context added), else the plan's (:meth:`StartPlan.gpu_need` with the engine's env)."""
    given = config.get("admission_request_bytes")
    if given:
        return int(given), "admission_request_bytes (per GPU)"
    plan = plan_of(config)
    env = config.get("env") if isinstance(config.get("env"), dict) else {}
    return plan.gpu_need(env) if plan is not None else (None, "no startup request in the plan")


def guard_free_line(config: Mapping[str, Any], need: Optional[int]) -> Tuple[int, str]:
    """The guard's --act-below-free-mib (0: evict at every growth) and why. auto: the engine's startup
    request on the node (``need``, admission's host figure) where the plan is a unified-memory one: page
    cache in the MemFree above it stands in no allocation of the engine's way, and evicting it costs the
    kernel CPU; 0 on a discrete GPU or without a request (the guard as before)."""
    value = config.get("guard_act_below_free_mib", "auto")
    if value != "auto":
        return int(value), "guard_act_below_free_mib"
    plan = plan_of(config)
    if plan is not None and plan.unified_memory is False:
        return 0, "auto: a discrete GPU (host memory is not the engine's)"
    if not need:
        return 0, "auto: no startup request in the plan"
    return -(-need // MIB), "auto: the engine's startup request"


def mem_available(proc_root: str) -> int:
    """MemAvailable of the node (proc_root/meminfo); a node where it cannot be read is refused, naming the file."""
    path = os.path.join(proc_root, "meminfo")
    try:
        meminfo = read_meminfo(proc_root)
    except OSError as err:
        raise UmaError(
            "proc_root", proc_root, "%s cannot be read for the admission (%s)" % (path, err.strerror or err),
            "Point proc_root at the node's /proc (the default), or set admission false; nothing was started.",
        ) from None  # fmt: skip
    if "MemAvailable" not in meminfo:
        raise UmaError(
            "proc_root", proc_root, "%s has no 'MemAvailable: <number> kB' line, the figure the admission "
            "compares (a kernel before 3.14, or not the kernel's file)" % path,
            "Run on a kernel that reports MemAvailable, or set admission false; nothing was started.",
        )  # fmt: skip
    return int(meminfo["MemAvailable"])


def admit(launch: Any, sleep: Callable[[float], None] = time.sleep) -> bool:
    """The admission of ``launch`` (program.Launch: its config, log, record, files and stop_signal), in the
    memory :func:`memory_mode` names. True: start; False: refused (the reason in the log and the record)."""
    if memory_mode(launch.config)[0] == "gpu":
        return admit_gpu(launch, sleep)
    return admit_host(launch, sleep)


def admit_host(launch: Any, sleep: Callable[[float], None]) -> bool:
    """MemAvailable must cover the plan's startup request. Short: evict the model's files again, wait
    (bounded) for it; still short: refuse with the numbers."""
    config, log = launch.config, launch.log
    started = time.monotonic()
    need, source = host_need(config)
    if not config["admission"] or need is None:
        log.step("admission", checked=False, reason="off" if not config["admission"] else source)
        return True
    available = mem_available(config["proc_root"])
    first = available
    evicted = 0
    if available < need and launch.files():
        evicted = evict_files(launch.files())
        available = mem_available(config["proc_root"])
    deadline = started + float(config["admission_wait_s"])
    said = started
    while available < need and time.monotonic() < deadline and launch.stop_signal is None:
        if time.monotonic() - said >= 10.0:
            said = time.monotonic()
            log.line(
                "admission: MemAvailable %.2f GiB < startup request %.2f GiB; waiting up to %ss"
                % (available / GIB_F, need / GIB_F, _fmt(config["admission_wait_s"]))
            )
        sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        available = mem_available(config["proc_root"])
    waited = time.monotonic() - started
    admission: Dict[str, Any] = {
        "memory": "host",
        "need_bytes": need,
        "need_source": source,
        "mem_available_bytes": available,
        "mem_available_first_bytes": first,
        "short_bytes": max(0, need - available),
        "evicted_bytes": evicted,
        "waited_s": round(waited, 3),
        "admitted": available >= need,
    }
    launch.record["admission"] = admission
    if available >= need:
        log.step("admission", duration=waited, mem_available=available, need=need, waited=round(waited, 3))
        return True
    reason = (
        "MemAvailable %.2f GiB is below the plan's startup request %.2f GiB (%s): short by %.2f GiB after "
        "evicting the model's cache and waiting %.0f s. Fix: free %.2f GiB on the node (stop another engine "
        "or process), or re-plan with less memory (uma.vllm.vllm_flags: lower max_model_len / max_num_seqs, "
        "a larger reserve_gib)"
        % (available / GIB_F, need / GIB_F, source, (need - available) / GIB_F, waited, (need - available) / GIB_F)
    )
    admission["reason"] = reason
    log.step("admission-refused", duration=waited, mem_available=available, need=need, reason=reason)
    return False


def read_gpus(timeout: Optional[float] = None) -> Tuple[Optional[List[Dict[str, Any]]], str]:
    """Every GPU nvidia-smi lists (NVML: all of the node's, whatever CUDA_VISIBLE_DEVICES says), in
    index order (index, uuid, free_bytes, total_bytes); or None and why not (nvidia-smi missing,
    failed, silent past ``timeout`` (NVIDIA_SMI_TIMEOUT_S) or unparsable). No shell; one that hangs
    in a wedged driver is killed and, if it does not die within a second, left behind."""
    timeout = NVIDIA_SMI_TIMEOUT_S if timeout is None else timeout
    try:
        proc = subprocess.Popen(list(NVIDIA_SMI), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
    except FileNotFoundError:
        return None, "nvidia-smi not found: " + NOT_CHECKED
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        return None, "nvidia-smi cannot be run (%s): %s" % (err, NOT_CHECKED)
    try:
        raw, raw_err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        return None, "nvidia-smi did not answer within %g s: %s" % (timeout, NOT_CHECKED)
    out = raw.decode("utf-8", "replace")
    if proc.returncode != 0:
        said = (raw_err.decode("utf-8", "replace").strip() or out.strip()).splitlines()
        return None, "nvidia-smi exited with %d (%s): %s" % (proc.returncode, (said or [""])[-1][:200], NOT_CHECKED)
    gpus = []
    for line in out.splitlines():
        if not line.strip():
            continue
        row = _GPU_ROW.match(line)
        if row is None:
            return None, "nvidia-smi printed %r, not index, uuid, free and total MiB: %s" % (line[:120], NOT_CHECKED)
        gpus.append({"index": int(row.group(1)), "uuid": row.group(2), "free_bytes": int(row.group(3)) * MIB,
                     "total_bytes": int(row.group(4)) * MIB})  # fmt: skip
    if not gpus:
        return None, "nvidia-smi listed no GPU: " + NOT_CHECKED
    return sorted(gpus, key=lambda g: g["index"]), ""


def pick_gpus(gpus: List[Dict[str, Any]], visible: Optional[str], count: int) -> Tuple[Optional[List[Any]], str]:
    """The engine's first ``count`` GPUs: CUDA_VISIBLE_DEVICES (indices or GPU-/MIG- UUIDs, or a
    unique UUID prefix as CUDA takes it) in its order, else every GPU in index order; or None and why.
    An index is nvidia-smi's (PCI bus order), which is CUDA's on a node of one GPU model (CUDA orders
    the fastest first, ties by PCI bus; CUDA_DEVICE_ORDER=PCI_BUS_ID makes it so everywhere)."""
    if visible is None:
        chosen = list(gpus)
    else:
        chosen = []
        for item in (i.strip() for i in visible.split(",")):
            if re.match(r"^[0-9]+$", item):
                found = [g for g in gpus if g["index"] == int(item)]
            else:
                found = [g for g in gpus if g["uuid"] == item] or [
                    g for g in gpus if item and g["uuid"].startswith(item)
                ]
            if len(found) != 1:
                return None, "CUDA_VISIBLE_DEVICES=%s names GPU %r, which nvidia-smi does not list: %s" % (
                    visible, item, NOT_CHECKED)  # fmt: skip
            chosen.append(found[0])
    if len(chosen) < count:
        return None, "the plan's gpus_per_node %d but %d GPU(s) visible%s: %s" % (
            count,
            len(chosen),
            " (CUDA_VISIBLE_DEVICES=%s)" % visible if visible is not None else "",
            NOT_CHECKED,
        )
    return chosen[:count], ""


def admit_gpu(launch: Any, sleep: Callable[[float], None]) -> bool:
    """Admission on a discrete GPU, for ``launch`` (program.Launch: its config, log, record and
    stop_signal): each of the engine's GPUs (gpus_per_node of them) must have gpu_need() free.
    Short: wait up to admission_wait_s for another process to free it, re-reading nvidia-smi (no
    page-cache eviction: it frees no GPU memory); still short: refuse, naming the GPU. Whatever
    keeps the GPUs from being read admits unchecked, with the reason logged and recorded."""
    config, log, record = launch.config, launch.log, launch.record
    started = time.monotonic()
    why = memory_mode(config)[1]
    need, source = gpu_need(config)
    if not config["admission"] or need is None:
        log.step("admission", checked=False, memory="gpu", reason="off" if not config["admission"] else source)
        return True
    plan = plan_of(config)
    count = plan.gpus if plan is not None else 1
    env = config.get("env") or {}
    visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    visible = None if visible is None or not str(visible).strip() else str(visible)

    def look() -> Tuple[Optional[List[Any]], str]:
        gpus, reason = read_gpus()
        return pick_gpus(gpus, visible, count) if gpus is not None else (None, reason)

    chosen, reason = look()
    deadline = started + float(config["admission_wait_s"])
    said = started
    while chosen is not None and any(g["free_bytes"] < need for g in chosen) and launch.stop_signal is None:
        if time.monotonic() >= deadline:
            break
        if time.monotonic() - said >= 10.0:
            said = time.monotonic()
            log.line("admission: a GPU has less than %.2f GiB free; waiting up to %ss" % (
                need / GIB_F, _fmt(config["admission_wait_s"])))  # fmt: skip
        sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        chosen, reason = look()
    waited = time.monotonic() - started
    if chosen is None:
        record["admission"] = {"memory": "gpu", "checked": False, "need_bytes": need, "need_source": source,
                               "waited_s": round(waited, 3), "admitted": None, "reason": reason}  # fmt: skip
        log.step("admission", duration=waited, checked=False, memory="gpu", need=need, reason=reason)
        return True
    short = [g for g in chosen if g["free_bytes"] < need]
    admission = {
        "memory": "gpu", "memory_why": why, "need_bytes": need, "need_source": source,
        "short_bytes": max([need - g["free_bytes"] for g in short] or [0]), "evicted_bytes": 0,
        "waited_s": round(waited, 3), "admitted": not short,
        "gpus": [{k: g[k] for k in ("index", "uuid", "free_bytes", "total_bytes")} for g in chosen],
    }  # fmt: skip
    record["admission"] = admission
    free = {str(g["index"]): g["free_bytes"] for g in chosen}
    if not short:
        log.step("admission", duration=waited, memory="gpu", gpu_free=free, need=need, waited=round(waited, 3))
        return True
    gpu = min(short, key=lambda g: g["free_bytes"] - need)
    admission["short_gpu"] = gpu["index"]
    admission["reason"] = reason = (
        "GPU %d (%s) has %.0f MiB (%.2f GiB) free of %.0f MiB (%.2f GiB), below the %.2f GiB this engine's start "
        "needs on it (%s): short by %.2f GiB after waiting %.0f s. Fix: stop the other process on GPU %d (see "
        "nvidia-smi), or re-plan with less (uma.vllm.vllm_flags: a lower gpu_memory_utilization or "
        "kv_cache_memory_bytes)"
        % (gpu["index"], gpu["uuid"], gpu["free_bytes"] / MIB, gpu["free_bytes"] / GIB_F, gpu["total_bytes"] / MIB,
           gpu["total_bytes"] / GIB_F, need / GIB_F, source, (need - gpu["free_bytes"]) / GIB_F, waited, gpu["index"])
    )  # fmt: skip
    log.step("admission-refused", duration=waited, memory="gpu", gpu_free=free, need=need, reason=reason)
    return False
