# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-side launcher's small parts (uma_launch.py, vllm-uma-launch).

Its log (one line per step on the journal), the node's launch lock (an ``flock`` on a
file, its holder written beside it), the model's files and their eviction from the page
cache, the guard's oom_score_adj, the engine child's set-up (parent-death signal, uid
change's working directory), the exit code of a process, the record's time stamp, and the
admission on a discrete GPU (each GPU's free memory from nvidia-smi: ``admit_gpu``).
Stdlib only; shipped beside ``uma_launch.py`` into the node's lib_dir by roles/launch_wrapper.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..base.common import node_write_json, open_safe_dir, path_error, read_state
from ..guard.residency import evict_paths, iter_files
from .config import PROG


class Log:
    """One line per step on stdout (the journal), with the time since start."""

    def __init__(self, engine: str, clock: Callable[[], float] = time.monotonic, out: Any = None) -> None:
        self.engine = engine
        self.clock = clock
        self.start = clock()
        self.out = out or sys.stdout
        self.steps: List[Dict[str, Any]] = []
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return round(self.clock() - self.start, 3)

    def step(self, name: str, duration: Optional[float] = None, **fields: Any) -> None:
        entry = {"name": name, "t": self.elapsed(), "at": round(time.time(), 3)}
        if duration is not None:
            entry["duration_s"] = round(duration, 3)
        entry.update(fields)
        self.steps.append(entry)
        extras = " ".join("%s=%s" % (k, _fmt(v)) for k, v in entry.items() if k not in ("name", "at"))
        self.line("%s %s" % (name, extras))

    def line(self, text: str) -> None:
        with self._lock:
            self.out.write("[%s %s] %s\n" % (PROG, self.engine, text))
            self.out.flush()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "%.3f" % value
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


class LaunchLock:
    """Per-node launch lock: flock on a file, holder written beside it."""

    def __init__(self, path: str, engine: str) -> None:
        self.path = path
        self.holder_path = path + ".holder"
        self.engine = engine
        self.fd: Optional[int] = None

    def try_acquire(self) -> bool:
        if self.fd is None:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, mode=0o755, exist_ok=True)
            dfd = open_safe_dir(directory)  # a root open(O_CREAT) never follows a planted symlink
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                self.fd = os.open(os.path.basename(self.path), flags, 0o644, dir_fd=dfd)
            finally:
                os.close(dfd)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        node_write_json(self.holder_path, {"engine": self.engine, "pid": os.getpid(), "since": time.time()})
        return True

    def holder(self) -> Optional[Dict[str, Any]]:
        data = read_state(self.holder_path, dict, _holder_problem, PROG)
        if data is None:
            return None
        pid = data.get("pid")
        data["alive"] = isinstance(pid, int) and _pid_alive(pid)
        return data

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            data = read_state(self.holder_path, dict, prog=PROG)
            if data is not None and data.get("pid") == os.getpid():
                os.unlink(self.holder_path)
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    @property
    def held(self) -> bool:
        return self.fd is not None


def point_latest(record_dir: str) -> None:
    """``<record_dir>/../latest`` -> this record: a symlink made under a random name in a checked directory."""
    parent = os.path.dirname(record_dir)
    os.close(open_safe_dir(parent))
    latest = os.path.join(parent, "latest")
    tmp = "%s.%s.tmp" % (latest, os.urandom(6).hex())
    os.symlink(os.path.basename(record_dir), tmp)
    try:
        os.replace(tmp, latest)
    except OSError:
        os.unlink(tmp)  # e.g. a directory where the link goes: said by the caller, nothing left behind
        raise


PID_MAX = 1 << 22  # the kernel's largest pid_max (PID_MAX_LIMIT on 64-bit)


def _holder_problem(data: Dict[str, Any]) -> Optional[str]:
    """The lock holder's record (what try_acquire writes): engine text, pid a process id, since a time.
    Another shape is set aside and named by read_state (the field and its value), never a waiting
    launcher's traceback; the waiting launcher then says it cannot tell who holds the lock."""
    pid, since, engine = data.get("pid"), data.get("since"), data.get("engine")
    if engine is not None and not isinstance(engine, str):
        return "its engine = %s is not text" % _shown(engine)
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= PID_MAX):
        return "its pid = %s is not a process id (a whole number from 1 to %d)" % (_shown(pid), PID_MAX)
    number = not isinstance(since, bool) and isinstance(since, (int, float))
    if since is not None and not (number and math.isfinite(since) and 0 <= since < 1 << 36):
        return "its since = %s is not a time (seconds since 1970)" % _shown(since)
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(
    lock: LaunchLock, timeout: float, log: Log, sleep: Callable[[float], None] = time.sleep, say_every: float = 10.0
) -> bool:
    """Wait for the lock, saying for whom; False at the timeout."""
    started = time.monotonic()
    said = -say_every
    while True:
        try:
            got = lock.try_acquire()
        except OSError as err:  # e.g. a symlink or an unsafe directory where the lock should be
            log.step("lock-failed", lock=lock.path, reason=err.strerror or str(err))
            fix = "Point lock_path at a file in a real directory of root, writable by nobody else."
            raise path_error(err, {"lock_path": lock.path}, fix) from None
        if got:
            waited = time.monotonic() - started
            log.step("lock-acquired", duration=waited, lock=lock.path)
            return True
        waited = time.monotonic() - started
        if waited >= timeout:
            log.step("lock-timeout", duration=waited, holder=lock.holder())
            return False
        if waited - said >= say_every:
            said = waited
            holder = lock.holder() or {}
            log.line(
                "waiting for the launch lock %s held by engine %s (pid %s, since %s)"
                % (
                    lock.path,
                    holder.get("engine", "?"),
                    holder.get("pid", "?"),
                    time.strftime("%H:%M:%S", time.localtime(holder["since"])) if "since" in holder else "?",
                )
            )
        sleep(0.2)


def model_files(model_path: Optional[str]) -> List[str]:
    if not model_path:
        return []
    return [entry[0] for entry in iter_files([model_path])]


def set_oom_score_adj(pid: int, value: int, proc_root: str = "/proc") -> Any:
    """Write ``value`` to the process's oom_score_adj; the value in force, or the error (best effort)."""
    path = os.path.join(proc_root, str(pid), "oom_score_adj")
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write("%d\n" % value)
        with open(path, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError) as err:
        return "not set: %s" % err


def evict_files(paths: List[str]) -> int:
    """posix_fadvise(DONTNEED) over each file; returns the bytes asked to go."""
    return evict_paths(paths)[0]


def drop_caches(proc_root: str, level: int = 1) -> None:
    with open(os.path.join(proc_root, "sys", "vm", "drop_caches"), "w", encoding="ascii") as handle:
        handle.write("%d\n" % level)


def _set_pdeathsig() -> None:
    """Child side: die with SIGTERM when the launcher dies (Linux prctl)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _engine_child(home: str) -> None:
    """Child side, after the uid change: the parent-death signal again, HOME as the cwd."""
    _set_pdeathsig()
    try:
        os.chdir(home)
    except OSError:
        os.chdir("/")


def node_shutting_down() -> bool:
    """True while systemd takes the node down (``systemctl is-system-running``: stopping)."""
    try:
        out = subprocess.run(
            ["systemctl", "is-system-running"], capture_output=True, text=True, timeout=3, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return out == "stopping"


def own_unit(cgroup_path: str = "/proc/self/cgroup") -> Optional[str]:
    """The systemd service this process runs in (the last ``*.service`` of its cgroup), or None."""
    try:
        with open(cgroup_path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            if part.endswith(".service") and re.match(r"^[A-Za-z0-9@_.:\\-]+$", part):
                return part
    return None


def unit_restarting(unit: Optional[str], runner: Optional[Callable[..., Any]] = None) -> bool:
    """True while systemd runs a restart job for ``unit`` (``systemctl restart``: it is stopped, then
    started again), as ``systemctl list-jobs`` shows it: ``ID UNIT restart running``."""
    if not unit:
        return False
    try:
        done = (runner or subprocess.run)(
            ["systemctl", "list-jobs", "--no-legend", "--plain", "--no-pager"],
            capture_output=True, text=True, timeout=3, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    for line in (getattr(done, "stdout", "") or "").splitlines():
        words = line.split()
        if len(words) >= 3 and words[1] == unit and words[2] in ("restart", "try-restart", "reload-or-restart"):
            return True
    return False


def exit_code(returncode: Optional[int]) -> int:
    if returncode is None:
        return 1
    if returncode < 0:
        return 128 + (-returncode)
    return returncode


def stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-%d" % os.getpid()


# Admission on a discrete GPU (uma_launch.py admit(), admission_memory gpu)
#
# vLLM's startup check compares gpu_memory_utilization x the GPU's total with the GPU's free
# memory (torch.cuda.mem_get_info(), taken after the process's own CUDA context). On a unified-
# memory node that free memory is the host's MemAvailable; on a discrete GPU it is the card's.

# The CUDA context vLLM's free-memory snapshot is taken after, where the plan has no cuda_context_bytes:
# 523.6-620 MiB measured on NVIDIA H200 and H100 machines, driver 580.159.04, torch 2.11 (docs/BENCHMARKS.md);
# the planner's CUDA_CONTEXT_BYTES (plan/budget.py), the same figure
CUDA_CONTEXT_BYTES = 805306368  # 0.75 GiB
# ... and with CUDA_MODULE_LOADING=EAGER in the engine's env: 1258-1260 MiB measured on an H200 and an H100
# (benchmarks/gpu_launch_check.py --contexts); the planner's CUDA_CONTEXT_EAGER_BYTES, the same figure
CUDA_CONTEXT_EAGER_BYTES = 1610612736  # 1.5 GiB
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=index,uuid,memory.free,memory.total", "--format=csv,noheader,nounits")
NVIDIA_SMI_TIMEOUT_S = 5.0
MIB = 1 << 20
GIB_F = float(1 << 30)
_GPU_ROW = re.compile(r"^\s*([0-9]+)\s*,\s*([^,\s][^,]*?)\s*,\s*([0-9]+)\s*,\s*([0-9]+)\s*$")
NOT_CHECKED = "the GPU's free memory is not checked (vLLM's own startup check still runs)"


def positive_number(value: Any) -> Optional[int]:
    """A positive number of the plan (a finite JSON number, not a boolean) as an integer, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return int(value)


def positive_int(value: Any) -> Optional[int]:
    """A count of the plan (ranks_per_node, gpus_per_node): a JSON integer >= 1, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def guard_free_line(config: Dict[str, Any], host_need: Optional[int]) -> Tuple[int, str]:
    """The guard's --act-below-free-mib (0: evict at every growth) and why. auto: the engine's startup
    request on the node (``host_need``, admission's figure) where the plan is a unified-memory one: page
    cache in the MemFree above it stands in no allocation of the engine's way, and evicting it costs the
    kernel CPU; 0 on a discrete GPU or without a request (the guard as before)."""
    value = config.get("guard_act_below_free_mib", "auto")
    if value != "auto":
        return int(value), "guard_act_below_free_mib"
    plan = config.get("plan") if isinstance(config.get("plan"), dict) else {}
    if plan.get("unified_memory") is False:
        return 0, "auto: a discrete GPU (host memory is not the engine's)"
    if not host_need:
        return 0, "auto: no startup request in the plan"
    return -(-host_need // MIB), "auto: the engine's startup request"


def admission_memory(config: Dict[str, Any]) -> Tuple[str, str]:
    """host or gpu, and why: admission_memory host or gpu as given; auto is gpu where the plan
    says ``unified_memory: false`` (a discrete GPU), else host (a unified-memory node, or a plan
    without the key: the published behaviour)."""
    mode = config.get("admission_memory") or "auto"
    if mode != "auto":
        return mode, "admission_memory %s" % mode
    plan = config.get("plan") if isinstance(config.get("plan"), dict) else {}
    if plan.get("unified_memory") is False:
        return "gpu", "auto: the plan says unified_memory false (a discrete GPU)"
    return "host", "auto: %s" % (
        "unified memory" if plan.get("unified_memory") is True else "no unified_memory in the plan"
    )


def gpu_need(config: Dict[str, Any]) -> Tuple[Optional[int], str]:
    """The free bytes each of the engine's GPUs needs, and from what.

    ``admission_request_bytes`` where given: what must be free on each GPU, as given (the whole
    need, no context added; in host mode it is the node's whole need, every rank included).
    Else the plan's ``requested_memory_bytes`` (one rank's request, ceil(total x
    gpu_memory_utilization) of its GPU) plus the CUDA context the snapshot is taken after
    (the plan's ``cuda_context_bytes``, else CUDA_CONTEXT_BYTES; at least CUDA_CONTEXT_EAGER_BYTES where
    the engine's env says CUDA_MODULE_LOADING=EAGER, whatever the plan was made with)."""
    given = config.get("admission_request_bytes")
    if given:
        return int(given), "admission_request_bytes (per GPU)"
    plan = config.get("plan") if isinstance(config.get("plan"), dict) else {}
    request = positive_number(plan.get("requested_memory_bytes"))
    if request is None:
        return None, "no startup request in the plan"
    context = plan.get("cuda_context_bytes")
    ok = isinstance(context, int) and not isinstance(context, bool) and 0 <= context < (1 << 40)
    context, said = (context, "plan cuda_context_bytes") if ok else (CUDA_CONTEXT_BYTES, "default")
    env = config.get("env") if isinstance(config.get("env"), dict) else {}
    eager = str(env.get("CUDA_MODULE_LOADING", "")).strip().upper() == "EAGER"
    if eager and context < CUDA_CONTEXT_EAGER_BYTES:
        context, said = CUDA_CONTEXT_EAGER_BYTES, "env CUDA_MODULE_LOADING=EAGER; the plan kept less"
    return request + context, "plan requested_memory_bytes + CUDA context %.2f GiB (%s)" % (context / GIB_F, said)


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
    """Admission on a discrete GPU, for ``launch`` (uma_launch.Launch: its config, log, record and
    stop_signal): each of the engine's GPUs (gpus_per_node of them) must have gpu_need() free.
    Short: wait up to admission_wait_s for another process to free it, re-reading nvidia-smi (no
    page-cache eviction: it frees no GPU memory); still short: refuse, naming the GPU. Whatever
    keeps the GPUs from being read admits unchecked, with the reason logged and recorded."""
    config, log, record = launch.config, launch.log, launch.record
    started = time.monotonic()
    why = admission_memory(config)[1]
    need, source = gpu_need(config)
    if not config["admission"] or need is None:
        log.step("admission", checked=False, memory="gpu", reason="off" if not config["admission"] else source)
        return True
    plan = config.get("plan") if isinstance(config.get("plan"), dict) else {}
    count = positive_int(plan.get("gpus_per_node")) or 1
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
