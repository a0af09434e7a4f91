# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Page-cache peak, load time, guard CPU and collateral eviction, per strategy.

Writes a real safetensors checkpoint (``--size-gib`` split into ``--shards``),
then, for every strategy and loader, interleaved and repeated ``--repeat``
times: drops caches, pre-touches memory (this VM hands free memory back to its
host), reads a bystander file (another workload's hot cache), starts the guard
(the real ``plugins/module_utils/node/guard/program.py`` CLI as a separate process),
loads the checkpoint while a separate process samples /proc/meminfo every
``--sample-ms``, and measures:

* peak growth of ``Cached`` above its value at load start (MiB, and as a
  multiple of the largest shard);
* load wall time as a ratio to the unguarded load (median/median and min/min);
* the guard's CPU time during the load, in % of one core (from its own
  rusage, /proc/PID/stat);
* how much of the bystander file was evicted (page-cache residency before and
  after, via cachestat/mincore).

Loaders: ``mmap`` is safetensors' ``safe_open`` (what vLLM's default loader
uses) copying every tensor out, as weights are copied to the device;
``sequential`` reads each shard with plain ``read()`` in 16 MiB chunks.

Needs root (drop_caches, read_ahead_kb). Every knob changed (the read_ahead_kb
of the disk under ``--dir``) is recorded and restored in a ``finally``.
Run it alone: other jobs on the machine make the numbers noisy.

    sudo .venv/bin/python benchmarks/page_cache.py                 # ~10 min
    sudo .venv/bin/python benchmarks/page_cache.py --quick         # ~1 min smoke run
    sudo .venv/bin/python benchmarks/page_cache.py --json > out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from _lab import ROOT, drop_caches, meminfo, node_lib, pretouch
from node.guard import config as _guard_config
from node.guard import memory as _guard_memory
from node.guard import residency as _guard_residency

# the guard as a node runs it: the node package installed (main() makes it) beside its entry script
GUARD = os.path.join(ROOT, ".cache", "node-lib", "uma_guard.py")

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_DIR = os.path.join(ROOT, ".cache", "bench")
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")
READAHEAD_PUBLISHED_KB = 8
LOADERS = ("mmap", "sequential")
# name -> (guard arguments or None, read_ahead_kb during the load or None = unchanged)
# "{ckpt}" is replaced by the checkpoint directory.
STRATEGIES: Dict[str, Tuple[Optional[List[str]], Optional[int]]] = {
    "none": (None, None),
    "published": (["--mode", "global", "--drop-level", "3", "--interval", "0.1"], READAHEAD_PUBLISHED_KB),
    "global": (["--mode", "global"], None),
    "files": (["--mode", "files", "--paths", "{ckpt}"], None),
    "adaptive": (["--mode", "adaptive", "--paths", "{ckpt}"], None),
    "adaptive+ra8": (["--mode", "adaptive", "--paths", "{ckpt}"], READAHEAD_PUBLISHED_KB),
    # not in the default set
    "global-l3": (["--mode", "global", "--drop-level", "3"], None),
    "adaptive-nopaths": (["--mode", "adaptive"], None),
    # the launcher's guard: growth is left alone while MemFree >= {line} MiB (--line-mib, default the
    # checkpoint's size: an engine takes at least its weights), as the launcher's line is the engine's request
    "adaptive-line": (["--mode", "adaptive", "--paths", "{ckpt}", "--act-below-free-mib", "{line}"], None),
    # not the guard: benchmarks/shard_prefetch.py (an experiment) beside the loader: shard 0 at once, then
    # one shard ahead of the mapped one, each consumed shard evicted (or, -noevict, left in the cache)
    "prefetch": (["--ahead", "1", "--first"], None),
    "prefetch-noevict": (["--ahead", "1", "--first", "--no-evict"], None),
}
PREFETCH_STRATEGIES = ("prefetch", "prefetch-noevict")
PREFETCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shard_prefetch.py")
DEFAULT_STRATEGIES = ["none", "published", "global", "files", "adaptive", "adaptive+ra8"]
GUARD_MODES = ("global", "files", "adaptive")
TENSOR_MIB_CYCLE = (64, 32, 16, 8, 1)
TARGETS = {
    "mmap_peak_x_shard": 1.1,
    "sequential_peak_mib": 64.0,
    "load_ratio": 1.05,
    "guard_cpu_pct": 2.0,
    "bystander_evicted_pct": 0.0,
}
BYSTANDER_KEEP_EVERY_S = 15.0


def log(text: str) -> None:
    sys.stderr.write("[page_cache] %s\n" % text)
    sys.stderr.flush()


# --------------------------------------------------------------------------
# Machine helpers


def fs_type(path: str) -> str:
    """Filesystem type of the mount holding ``path`` (from /proc/self/mountinfo)."""
    path = os.path.realpath(path)
    best, best_type = "", "unknown"
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            left, _unused, right = line.partition(" - ")
            mount_point = left.split()[4].replace("\\040", " ")
            inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best):
                best, best_type = mount_point, right.split()[0]
    return best_type


def read_knob(path: str) -> str:
    with open(path, encoding="ascii") as handle:
        return handle.read().strip()


def write_knob(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value + "\n")


def disk_stat_file(path: str) -> Optional[str]:
    """The ``stat`` file of the disk under ``path`` (its queue's parent directory)."""
    queue = _guard_residency.block_queue_dir(os.stat(path).st_dev)
    stat_file = os.path.join(os.path.dirname(queue), "stat") if queue else None
    return stat_file if stat_file and os.path.exists(stat_file) else None


def sectors_read(stat_file: Optional[str]) -> int:
    """512-byte sectors read from the disk so far (field 3 of its stat file)."""
    if stat_file is None:
        return 0
    return int(read_knob(stat_file).split()[2])


# --------------------------------------------------------------------------
# Checkpoint


def shard_plan(size_bytes: int, shards: int) -> List[List[int]]:
    """Tensor sizes (bytes) per shard: sizes cycle through TENSOR_MIB_CYCLE, even bytes."""
    per_shard = size_bytes // shards
    plan = []
    for _unused in range(shards):
        tensors, left, i = [], per_shard, 0
        while left >= 2 * 1024:
            size = min(left, TENSOR_MIB_CYCLE[i % len(TENSOR_MIB_CYCLE)] * MIB)
            size -= size % 2048
            tensors.append(size)
            left -= size
            i += 1
        plan.append(tensors)
    return plan


def write_checkpoint(directory: str, size_gib: float, shards: int) -> List[str]:
    """Write (or reuse) ``shards`` safetensors files of ``size_gib`` in total."""
    import numpy as np
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    manifest_path = os.path.join(directory, "manifest.json")
    want = {"size_gib": size_gib, "shards": shards, "cycle_mib": list(TENSOR_MIB_CYCLE)}
    names = ["model-%05d-of-%05d.safetensors" % (i + 1, shards) for i in range(shards)]
    paths = [os.path.join(directory, n) for n in names]
    try:
        with open(manifest_path, encoding="utf-8") as handle:
            have = json.load(handle)
        if have.get("spec") == want and all(os.path.getsize(p) == s for p, s in zip(paths, have["sizes"])):
            return paths
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for entry in os.listdir(directory):
        if entry.endswith(".safetensors") or entry == "manifest.json":
            os.unlink(os.path.join(directory, entry))
    rng = np.random.default_rng(20240611)
    log("writing a %.2f GiB checkpoint in %d shards to %s" % (size_gib, shards, directory))
    for path, tensors in zip(paths, shard_plan(int(size_gib * GIB), shards)):
        data = {}
        for j, nbytes in enumerate(tensors):
            arr = np.frombuffer(rng.bytes(nbytes), dtype=np.float16)
            data["model.layers.%d.weight" % j] = arr.reshape(-1, 1024)
        save_file(data, path, metadata={"format": "pt"})
        del data
    os.sync()
    sizes = [os.path.getsize(p) for p in paths]
    with open(manifest_path, "w", encoding="utf-8") as handle:
        json.dump({"spec": want, "sizes": sizes}, handle)
    return paths


def write_bystander(path: str, size_mib: int) -> None:
    if os.path.exists(path) and os.path.getsize(path) == size_mib * MIB:
        return
    with open(path, "wb") as handle:
        for _unused in range(size_mib):
            handle.write(os.urandom(MIB))
    os.sync()


def read_through(path: str) -> float:
    started = time.perf_counter()
    buf = bytearray(4 * MIB)
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buf):
            pass
    return time.perf_counter() - started


# --------------------------------------------------------------------------
# Loaders


def load_mmap(paths: List[str]) -> None:
    """vLLM's default loader: safe_open (mmap) and copy every tensor out."""
    import numpy as np
    from safetensors import safe_open

    for path in paths:
        with safe_open(path, framework="numpy") as handle:
            for key in handle.keys():
                copy = np.array(handle.get_tensor(key), copy=True)
                del copy


def load_sequential(paths: List[str]) -> None:
    buf = bytearray(16 * MIB)
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(buf):
                pass


LOAD = {"mmap": load_mmap, "sequential": load_sequential}


# --------------------------------------------------------------------------
# Sampler (a separate process, so the loader's GIL never delays a sample)


def _sampler(conn: Any, every: float, bystander: str, paths: List[str]) -> None:
    samples = []
    # the checkpoint's own pages in the page cache (cachestat per shard): unlike
    # Cached, other jobs' I/O on a shared machine does not count here
    residency = _guard_residency.Residency()
    files = [(os.open(p, os.O_RDONLY), os.path.getsize(p)) for p in paths]
    state = {"min_resident": 1.0, "checks": 0}
    stop = threading.Event()

    def keeper() -> None:
        # DAMON here pages out file pages idle for >= 60 s: keep the bystander
        # warm while it is fully resident, and record any eviction first.
        residency = _guard_residency.Residency()
        while not stop.wait(BYSTANDER_KEEP_EVERY_S):
            resident, size = _guard_residency.file_residency(bystander, residency)
            state["checks"] += 1
            state["min_resident"] = min(state["min_resident"], resident / float(size))
            if resident >= size:
                read_through(bystander)

    thread = threading.Thread(target=keeper, daemon=True)
    thread.start()
    reader = _guard_memory.MeminfoReader("/proc")
    while not conn.poll(every):
        info = reader.read()
        resident = sum(residency.resident_bytes(fd, size) or 0 for fd, size in files)
        free = info.get("MemFree", 0)
        samples.append((time.monotonic(), info.get("Cached", 0), info.get("Mapped", 0), resident, free))
    stop.set()
    for fd, _size in files:
        os.close(fd)
    conn.send({"samples": samples, "bystander_min_resident": state["min_resident"], "checks": state["checks"]})
    conn.close()


class Sampler:
    def __init__(self, every: float, bystander: str, paths: List[str]) -> None:
        ctx = multiprocessing.get_context("fork")
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_sampler, args=(child, every, bystander, paths), daemon=True)

    def __enter__(self) -> Sampler:
        self.proc.start()
        return self

    def stop(self) -> Dict[str, Any]:
        self.parent.send("stop")
        result = self.parent.recv()
        self.proc.join(10)
        return result

    def __exit__(self, *exc: Any) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


# --------------------------------------------------------------------------
# Guard process


def node_cpu() -> Tuple[float, float]:
    """CPU seconds the whole node has used (all CPUs: user, nice, system, irq, softirq from /proc/stat) and
    those of its kswapd threads: where the kernel's own reclaim goes when no guard evicts."""
    tick = float(os.sysconf("SC_CLK_TCK"))
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(x) for x in handle.readline().split()[1:8]]
    busy = (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / tick
    kswapd = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % pid, encoding="ascii") as handle:
                if not handle.read().startswith("kswapd"):
                    continue
            kswapd += sum(_stat_user_sys(int(pid)))
        except (OSError, ValueError):
            continue
    return busy, kswapd


def guard_cpu(pid: int) -> float:
    """CPU seconds a live process has used (all its threads).

    /proc/PID/task/*/schedstat gives the runtime in ns (the source of its
    rusage); /proc/PID/stat only has clock ticks (10 ms), too coarse for a
    few-second load.
    """
    total, found = 0, False
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid), encoding="ascii") as handle:
                total += int(handle.read().split()[0])
                found = True
        except (OSError, ValueError, IndexError):
            pass
    if found:
        return total / 1e9
    return sum(_stat_user_sys(pid))


def _stat_user_sys(pid: int) -> Tuple[float, float]:
    """utime and stime of a process from /proc/PID/stat, in seconds (clock ticks); OSError if it is gone."""
    with open("/proc/%d/stat" % pid, encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    tick = float(os.sysconf("SC_CLK_TCK"))
    return int(fields[11]) / tick, int(fields[12]) / tick


def guard_user_sys(pid: int) -> Tuple[float, float]:
    """User and system CPU seconds of a live process (/proc/PID/stat, clock ticks): where its CPU goes.

    The guard's CPU is almost all system time: the kernel freeing the page cache it evicts
    (measured 26 Nov 2026: user 0.00-0.03 s, system 0.31-0.37 s per 2 GiB load).
    """
    try:
        return _stat_user_sys(pid)
    except OSError:
        return 0.0, 0.0


class Hog:
    """Anonymous memory held by a child process (numpy, every page written) for the whole benchmark, so
    that only ``short_mib`` MiB are available when each run starts: the load then runs the node short, as a
    checkpoint larger than free memory does on a unified-memory node. The child is the OOM killer's first
    pick (oom_score_adj 1000) and dies with the benchmark."""

    CODE = (
        "import sys, numpy as np\n"
        "b = np.empty(int(sys.argv[1]), dtype=np.uint8); b.fill(1)\n"
        "sys.stdout.write('ok\\n'); sys.stdout.flush(); sys.stdin.read()\n"
    )

    def __init__(self, short_mib: int) -> None:
        self.short_mib = short_mib
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> int:
        drop_caches()
        nbytes = meminfo()["MemAvailable"] - self.short_mib * MIB
        if nbytes < 256 * MIB:
            raise SystemExit("page_cache.py: --short-mib %d leaves nothing to hold (MemAvailable %d MiB)" % (
                self.short_mib, meminfo()["MemAvailable"] // MIB))  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.CODE, str(nbytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        with open("/proc/%d/oom_score_adj" % self.proc.pid, "w", encoding="ascii") as handle:
            handle.write("1000\n")
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ok":
            raise SystemExit("page_cache.py: the memory holder died (exit %s)" % self.proc.wait())
        return nbytes // MIB

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class _Child:
    """A helper process beside the load (the guard, the prefetch): killed if the run fails."""

    proc: Optional[subprocess.Popen] = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class PrefetchProcess(_Child):
    """benchmarks/shard_prefetch.py beside this process's own loader (--pid: this process)."""

    def __init__(self, args: List[str], ckpt: str) -> None:
        self.cmd = [sys.executable, PREFETCH, "--pid", str(os.getpid()), "--paths", ckpt, *args]
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def stop(self) -> Dict[str, Any]:
        assert self.proc is not None
        try:  # after an mmap load every shard is unmapped: it stops by itself
            out, err = self.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            out, err = self.proc.communicate(timeout=30)
        try:
            status = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            status = {"error": err.decode(errors="replace")[-400:]}
        status["exit_code"] = self.proc.returncode
        return status


class GuardProcess(_Child):
    def __init__(self, strategy: str, args: List[str], ckpt: str, workdir: str, extra: List[str], nice: int) -> None:
        self.status_file = os.path.join(workdir, "guard-status.json")
        if os.path.exists(self.status_file):
            os.unlink(self.status_file)
        argv = [a.replace("{ckpt}", ckpt) for a in args] + list(extra)
        self.cmd = [sys.executable, GUARD, "--name", "bench-" + strategy, *argv]
        self.cmd += ["--max-duration", "3600", "--status-file", self.status_file]
        if nice:
            self.cmd = ["nice", "-n", str(nice), *self.cmd]
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 15.0) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.status_file):
                return
            if self.proc.poll() is not None:
                raise RuntimeError("guard exited early: %s" % self.proc.stderr.read().decode(errors="replace"))
            time.sleep(0.02)
        raise RuntimeError("guard wrote no status within %.0f s" % timeout)

    def stop(self) -> Dict[str, Any]:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with open(self.status_file, encoding="utf-8") as handle:
            status = json.load(handle)
        status["exit_code"] = self.proc.returncode
        return status


# --------------------------------------------------------------------------
# One run


def one_run(
    strategy: str, loader: str, paths: List[str], ckpt: str, bystander: str, knob: str, knob_orig: str, opts: Any
) -> Dict[str, Any]:
    args, ra_kb = STRATEGIES[strategy]
    args = [a.replace("{line}", str(opts.line_mib)) for a in args] if args is not None else None
    write_knob(knob, str(ra_kb) if ra_kb is not None else knob_orig)
    drop_caches()
    total = sum(os.path.getsize(p) for p in paths)
    avail = meminfo().get("MemAvailable", 0)
    # with --short-mib the hog's pages are the warm ones and there is no room to touch more
    pretouch_s = pretouch(max(GIB, min(total + GIB, avail - 2 * GIB))) if not opts.short_mib else 0.0
    read_through(bystander)
    residency = _guard_residency.Residency()
    by_before, by_size = _guard_residency.file_residency(bystander, residency)
    guard: Any = None
    if strategy in PREFETCH_STRATEGIES:
        guard = PrefetchProcess(args or [], ckpt)
    elif args is not None:
        guard = GuardProcess(strategy, args, ckpt, opts.workdir, opts.guard_args, opts.guard_nice)
    result: Dict[str, Any] = {"strategy": strategy, "loader": loader, "pretouch_s": round(pretouch_s, 2)}
    try:
        with Sampler(opts.sample_ms / 1000.0, bystander, paths) as sampler:
            if guard is not None:
                guard.start()
            node0 = node_cpu()
            cpu0 = guard_cpu(guard.proc.pid) if guard else 0.0
            split0 = guard_user_sys(guard.proc.pid) if guard else (0.0, 0.0)
            base = meminfo()
            sectors0 = sectors_read(opts.disk_stat)
            t0 = time.monotonic()
            LOAD[loader](paths)
            t1 = time.monotonic()
            node1 = node_cpu()
            sectors1 = sectors_read(opts.disk_stat)
            cpu1 = guard_cpu(guard.proc.pid) if guard else 0.0
            split1 = guard_user_sys(guard.proc.pid) if guard else (0.0, 0.0)
            by_after, _unused = _guard_residency.file_residency(bystander, residency)
            sampled = sampler.stop()
        status = guard.stop() if guard is not None else None
    finally:
        if guard is not None:
            guard.kill()
        write_knob(knob, knob_orig)
    window = [s for s in sampled["samples"] if t0 <= s[0] <= t1]
    times = [s[0] for s in window]
    gaps = [b - a for a, b in zip(times, times[1:])]
    peak_cached = max([s[1] for s in window] + [base["Cached"]])
    peak_mapped = max([s[2] for s in window] + [base["Mapped"]])
    peak_resident = max([s[3] for s in window] + [0])
    min_resident = min(sampled["bystander_min_resident"], by_after / float(by_size))
    result.update(
        {
            "load_s": round(t1 - t0, 3),
            "baseline_cached_mib": round(base["Cached"] / MIB, 1),
            "peak_growth_mib": round((peak_cached - base["Cached"]) / MIB, 1),
            "peak_mapped_mib": round(peak_mapped / MIB, 1),
            "peak_resident_mib": round(peak_resident / MIB, 1),
            "disk_read_ratio": round((sectors1 - sectors0) * 512.0 / total, 3),
            "samples": len(window),
            "max_sample_gap_ms": round(1000 * max(gaps), 1) if gaps else None,
            "guard_cpu_s": round(cpu1 - cpu0, 3),
            "guard_user_s": round(split1[0] - split0[0], 2),
            "guard_sys_s": round(split1[1] - split0[1], 2),
            "guard_cpu_pct": round(100.0 * (cpu1 - cpu0) / max(1e-9, t1 - t0), 2),
            "guard_cpu_ms_per_gib": round(1000.0 * (cpu1 - cpu0) / (total / float(GIB)), 1),
            # the whole node during the load (loader, guard, kswapd, everything else) and kswapd alone
            "node_cpu_s": round(node1[0] - node0[0], 2),
            "kswapd_cpu_s": round(node1[1] - node0[1], 2),
            "min_free_mib": round(min([s[4] for s in window] + [base["MemFree"]]) / MIB, 1),
            "bystander_resident_before_pct": round(100.0 * by_before / by_size, 1),
            "bystander_evicted_pct": round(100.0 * (1.0 - min_resident), 1),
            "bystander_reread_s": round(read_through(bystander), 3),
        }
    )
    if status is not None and strategy in PREFETCH_STRATEGIES:
        result["prefetch"] = status
        if status.get("exit_code") != 0 or status.get("error"):
            result["error"] = "prefetch: exit %r %s" % (status.get("exit_code"), status.get("error") or "")
    elif status is not None:
        result["guard"] = {
            k: status.get(k)
            for k in (
                "ticks",
                "held_ticks",
                "evictions",
                "evicted_bytes",
                "sweeps",
                "inotify_batches",
                "file_checks",
                "cpu_seconds",
                "stop_reason",
                "exit_code",
                "triggers",
            )
        }
        if status.get("stop_reason") != "signal" or status.get("exit_code") != 0:
            result["error"] = "guard stopped with %r (exit %r)" % (status.get("stop_reason"), status.get("exit_code"))
    return result


# --------------------------------------------------------------------------
# Summary


def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def summarize(runs: List[Dict[str, Any]], strategies: List[str], largest_mib: float) -> Dict[str, Any]:
    by: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for run in runs:
        if "error" not in run:
            by.setdefault((run["strategy"], run["loader"]), []).append(run)
    summary: Dict[str, Any] = {}
    for strategy in strategies:
        per_loader = {}
        for loader in LOADERS:
            rows = by.get((strategy, loader), [])
            base = by.get(("none", loader), [])
            if not rows:
                continue
            loads = [r["load_s"] for r in rows]
            base_loads = [r["load_s"] for r in base]
            peak = _median([r["peak_growth_mib"] for r in rows])
            resident = _median([r["peak_resident_mib"] for r in rows])
            per_loader[loader] = {
                "runs": len(rows),
                "peak_growth_mib": round(peak, 1),
                "peak_growth_max_mib": max(r["peak_growth_mib"] for r in rows),
                "peak_x_shard": round(peak / largest_mib, 3),
                "peak_resident_mib": round(resident, 1),
                "peak_resident_x_shard": round(resident / largest_mib, 3),
                "largest_shard_mib": round(largest_mib, 1),
                "load_s": round(_median(loads), 3),
                "load_ratio": round(_median(loads) / _median(base_loads), 3) if base_loads else None,
                "load_ratio_min": round(min(loads) / min(base_loads), 3) if base_loads else None,
                "guard_cpu_pct": round(_median([r["guard_cpu_pct"] for r in rows]), 2),
                "guard_cpu_ms_per_gib": round(_median([r["guard_cpu_ms_per_gib"] for r in rows]), 1),
                "node_cpu_s": _median([r.get("node_cpu_s", 0.0) for r in rows]),
                "kswapd_cpu_s": _median([r.get("kswapd_cpu_s", 0.0) for r in rows]),
                "min_free_mib": _median([r.get("min_free_mib", 0.0) for r in rows]),
                "bystander_evicted_pct": round(_median([r["bystander_evicted_pct"] for r in rows]), 1),
                "bystander_evicted_max_pct": max(r["bystander_evicted_pct"] for r in rows),
                "evictions": _median([r.get("guard", {}).get("evictions", 0) for r in rows]),
                "disk_read_ratio": round(_median([r["disk_read_ratio"] for r in rows]), 3),
                "max_sample_gap_ms": max((r["max_sample_gap_ms"] or 0) for r in rows),
            }
        if not per_loader:
            continue
        primary = per_loader.get("mmap") or next(iter(per_loader.values()))
        entry = {
            k: primary[k]
            for k in ("peak_growth_mib", "largest_shard_mib", "load_ratio", "guard_cpu_pct", "bystander_evicted_pct")
        }
        entry["loader"] = "mmap" if "mmap" in per_loader else next(iter(per_loader))
        entry["by_loader"] = per_loader
        summary[strategy] = entry
    return summary


def check_targets(summary: Dict[str, Any], mode: str) -> Dict[str, Any]:
    """Each target for the default mode (and the collateral target for files/adaptive).

    Peaks are checked twice: on the growth of ``Cached`` (what the issue
    specifies) and on the checkpoint's own residency (``met_by_residency``),
    which other jobs' I/O on a shared machine cannot inflate.
    """
    checks: Dict[str, Any] = {}
    s = summary.get(mode, {}).get("by_loader", {})
    if "mmap" in s:
        checks["mmap_peak_x_shard"] = _check(
            s["mmap"]["peak_x_shard"], TARGETS["mmap_peak_x_shard"], s["mmap"]["peak_resident_x_shard"]
        )
    if "sequential" in s:
        checks["sequential_peak_mib"] = _check(
            s["sequential"]["peak_growth_mib"], TARGETS["sequential_peak_mib"], s["sequential"]["peak_resident_mib"]
        )
    for loader, row in s.items():
        if row["load_ratio"] is not None:
            checks["load_ratio_%s" % loader] = _check(row["load_ratio"], TARGETS["load_ratio"])
        checks["guard_cpu_pct_%s" % loader] = _check(row["guard_cpu_pct"], TARGETS["guard_cpu_pct"])
    floor = bystander_noise_floor(summary)
    for other in ("files", "adaptive"):
        for loader, row in summary.get(other, {}).get("by_loader", {}).items():
            check = _check(row["bystander_evicted_pct"], TARGETS["bystander_evicted_pct"])
            check["max"] = row["bystander_evicted_max_pct"]
            check["noise_floor"] = floor
            check["max_within_noise"] = row["bystander_evicted_max_pct"] <= max(TARGETS["bystander_evicted_pct"], floor)
            checks["bystander_%s_%s" % (other, loader)] = check
    return checks


def bystander_noise_floor(summary: Dict[str, Any]) -> float:
    """The most of the bystander lost in a run without any guard: eviction up to this is not the guard's.

    This VM runs DAMON pageout (regions idle >= 60 s, judged on one sampled page
    per region), which now and then takes a few pages of a freshly read file.
    """
    rows = summary.get("none", {}).get("by_loader", {}).values()
    return max([r["bystander_evicted_max_pct"] for r in rows] + [0.0])


def _check(value: float, limit: float, by_residency: Optional[float] = None) -> Dict[str, Any]:
    result = {"value": value, "limit": limit, "met": value <= limit}
    if by_residency is not None:
        result["by_residency"] = by_residency
        result["met_by_residency"] = by_residency <= limit
    return result


def recommend_mode(summary: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Rank the guard modes on this run: fewest targets missed, then the smallest total excess.

    Peaks are judged on the checkpoint's residency (other jobs' I/O cannot
    inflate it), the bystander above the no-guard noise floor, and the load
    ratio on the better of median/median and min/min (differences under
    15-20% are noise on this machine). The excess of a missed target is
    value / limit - 1 (for the bystander: percentage points / 100).
    """
    floor = bystander_noise_floor(summary)
    ranked = []
    for mode in GUARD_MODES:
        rows = summary.get(mode, {}).get("by_loader", {})
        if set(rows) != set(LOADERS):
            continue
        pairs = [
            (rows["mmap"]["peak_resident_x_shard"], TARGETS["mmap_peak_x_shard"]),
            (rows["sequential"]["peak_resident_mib"], TARGETS["sequential_peak_mib"]),
        ]
        for row in rows.values():
            ratio = min(r for r in (row["load_ratio"], row["load_ratio_min"]) if r is not None)
            pairs.append((ratio, TARGETS["load_ratio"]))
            pairs.append((row["guard_cpu_pct"], TARGETS["guard_cpu_pct"]))
        missed = [max(0.0, value / limit - 1.0) for value, limit in pairs if value > limit]
        lost = max(r["bystander_evicted_pct"] for r in rows.values())
        if lost > max(TARGETS["bystander_evicted_pct"], floor):
            missed.append(lost / 100.0)
        ranked.append((len(missed), round(sum(missed), 3), mode))
    if not ranked:
        return None
    ranked.sort()
    return {"mode": ranked[0][2], "ranking": [{"mode": m, "missed": n, "excess": e} for n, e, m in ranked]}


def readahead_verdict(summary: Dict[str, Any]) -> Dict[str, Any]:
    """Does read_ahead_kb=8 during the load earn its cost on top of the default guard?"""
    plain = summary.get("adaptive", {}).get("by_loader", {})
    small = summary.get("adaptive+ra8", {}).get("by_loader", {})
    evidence = {}
    earns = False
    for loader in LOADERS:
        if loader not in plain or loader not in small:
            continue
        gain = plain[loader]["peak_resident_mib"] - small[loader]["peak_resident_mib"]
        cost = (small[loader]["load_ratio"] or 0) - (plain[loader]["load_ratio"] or 0)
        evidence[loader] = {
            "peak_saved_mib": round(gain, 1),
            "load_ratio_without": plain[loader]["load_ratio"],
            "load_ratio_with": small[loader]["load_ratio"],
        }
        # worth it only if it saves a meaningful share of a shard at no real cost
        if gain > 0.1 * plain[loader]["largest_shard_mib"] and cost <= 0.05:
            earns = True
    if not evidence:
        return {"readahead_during_load": None, "evidence": {}}
    return {"readahead_during_load": earns, "evidence": evidence}


def table(summary: Dict[str, Any]) -> str:
    head = "| strategy | loader | peak Cached growth MiB (x shard) | peak ckpt resident MiB (x shard) | load s |"
    head += " load ratio med / min | guard CPU % | node CPU s (kswapd s) | bystander evicted % | disk read / size |"
    lines = [head, "|" + "---|" * 10]
    for strategy, entry in summary.items():
        for loader, row in entry["by_loader"].items():
            ratio = "%.2f / %.2f" % (row["load_ratio"], row["load_ratio_min"]) if row["load_ratio"] else "-"
            lines.append(
                "| %s | %s | %.0f (%.2f) | %.0f (%.2f) | %.1f | %s | %.2f | %.2f (%.2f) | %.0f | %.2f |"
                % (
                    strategy,
                    loader,
                    row["peak_growth_mib"],
                    row["peak_x_shard"],
                    row["peak_resident_mib"],
                    row["peak_resident_x_shard"],
                    row["load_s"],
                    ratio,
                    row["guard_cpu_pct"],
                    row.get("node_cpu_s") or 0.0,
                    row.get("kswapd_cpu_s") or 0.0,
                    row["bystander_evicted_pct"],
                    row["disk_read_ratio"],
                )
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Main


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--dir", default=DEFAULT_DIR, help="checkpoint directory on a real disk (default %(default)s)")
    p.add_argument("--size-gib", type=float, default=2.0, help="checkpoint size (default %(default)s)")
    p.add_argument("--shards", type=int, default=2, help="shard count (default %(default)s)")
    p.add_argument("--repeat", type=int, default=3, help="runs per strategy and loader (default %(default)s)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES), help="comma list, or 'all'")
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma list of mmap,sequential")
    p.add_argument("--bystander-mib", type=int, default=256, help="hot file of another workload (default %(default)s)")
    p.add_argument("--sample-ms", type=float, default=10.0, help="meminfo sampling period (default %(default)s)")
    p.add_argument("--guard-args", default="", help="extra arguments for every guard, for experiments")
    p.add_argument("--guard-nice", type=int, default=0, help="run the guard under nice -n N (default 0)")
    p.add_argument("--line-mib", type=int, help="adaptive-line's --act-below-free-mib (default: the checkpoint's size)")
    p.add_argument(
        "--short-mib",
        type=int,
        default=0,
        help="hold anonymous memory so that only N MiB are available when the runs start (0: off): memory runs "
        "short during the load and the kernel must reclaim, as on a unified-memory node",
    )
    p.add_argument("--quick", action="store_true", help="1-minute smoke run: 0.5 GiB, 2 shards, 1 repeat")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--output", help="results file (default benchmarks/results/page_cache-<time>.json)")
    p.add_argument("--from-results", metavar="FILE", help="summarize the runs of an earlier results file again")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.size_gib, opts.shards, opts.repeat = 0.5, 2, 1
    opts.strategies = list(STRATEGIES) if opts.strategies == "all" else opts.strategies.split(",")
    opts.loaders = opts.loaders.split(",")
    opts.guard_args = opts.guard_args.split()
    for name in opts.strategies:
        if name not in STRATEGIES:
            p.error("unknown strategy %r (known: %s)" % (name, ", ".join(STRATEGIES)))
    if "none" not in opts.strategies:
        opts.strategies.insert(0, "none")
    for loader in opts.loaders:
        if loader not in LOADERS:
            p.error("unknown loader %r (known: %s)" % (loader, ", ".join(LOADERS)))
    if opts.size_gib <= 0 or opts.shards < 1 or opts.repeat < 1 or not 0 < opts.sample_ms <= 50:
        p.error("--size-gib > 0, --shards >= 1, --repeat >= 1 and 0 < --sample-ms <= 50")
    if opts.short_mib < 0 or (opts.short_mib and opts.short_mib < 256) or (opts.line_mib or 0) < 0:
        p.error("--short-mib is 0 or at least 256 (MiB), --line-mib at least 0")
    return opts


def evaluate(runs: List[Dict[str, Any]], strategies: List[str], largest_mib: float) -> Dict[str, Any]:
    summary = summarize(runs, strategies, largest_mib)
    return {
        "default_mode": _guard_config.DEFAULT_MODE,
        "recommended_mode": recommend_mode(summary),
        "readahead": readahead_verdict(summary),
        "targets": check_targets(summary, _guard_config.DEFAULT_MODE),
        "strategies": summary,
    }


def report(result: Dict[str, Any], as_json: bool, out: Optional[str]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        return
    print(table(result["strategies"]))
    print()
    rec = result["recommended_mode"] or {}
    print("default_mode: %s (this run ranks: %s)" % (result["default_mode"], json.dumps(rec.get("ranking"))))
    print("readahead_during_load: %s" % json.dumps(result["readahead"]))
    print("targets (%s): %s" % (result["default_mode"], json.dumps(result["targets"])))
    if out:
        print("results: %s" % os.path.relpath(out, ROOT))


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    if opts.from_results:
        with open(opts.from_results, encoding="utf-8") as handle:
            earlier = json.load(handle)
        largest = max(row["largest_shard_mib"] for row in earlier["strategies"].values())
        strategies = list(earlier["strategies"])
        earlier.update(evaluate(earlier["runs"], strategies, largest))
        if opts.output:
            with open(opts.output, "w", encoding="utf-8") as handle:
                json.dump(earlier, handle, indent=2, sort_keys=True)
                handle.write("\n")
        report(earlier, opts.json, opts.output)
        return 0
    if os.geteuid() != 0:
        log("needs root: it drops caches and sets read_ahead_kb")
        return 2
    node_lib(os.path.dirname(GUARD))
    os.makedirs(opts.dir, exist_ok=True)
    ftype = fs_type(opts.dir)
    if ftype in ("tmpfs", "ramfs"):
        log("%s is on %s: put the checkpoint on a real disk (--dir)" % (opts.dir, ftype))
        return 2
    ckpt = os.path.join(opts.dir, "ckpt")
    paths = write_checkpoint(ckpt, opts.size_gib, opts.shards)
    bystander = os.path.join(opts.dir, "bystander.bin")
    write_bystander(bystander, opts.bystander_mib)
    knob = _guard_residency.read_ahead_kb_file(ckpt)
    if knob is None:
        log("no read_ahead_kb found for the disk under %s" % ckpt)
        return 2
    knob_orig = read_knob(knob)
    opts.disk_stat = disk_stat_file(ckpt)
    largest_mib = max(os.path.getsize(p) for p in paths) / float(MIB)
    if opts.line_mib is None:
        opts.line_mib = -(-sum(os.path.getsize(p) for p in paths) // MIB)
    machine = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "mem_total_gib": round(meminfo()["MemTotal"] / GIB, 1),
        "fs_type": ftype,
        "read_ahead_kb_file": knob,
        "read_ahead_kb": knob_orig,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "residency_method": _guard_residency.Residency().method,
    }
    log("machine: %s" % json.dumps(machine))
    runs: List[Dict[str, Any]] = []
    started = time.monotonic()
    opts.workdir = tempfile.mkdtemp(prefix="uma-bench-")
    hog = Hog(opts.short_mib) if opts.short_mib else None
    if hog is not None:
        machine["hog_mib"] = hog.start()
        log("holding %d MiB of anonymous memory: MemAvailable %d MiB, MemFree %d MiB" % (
            machine["hog_mib"], meminfo()["MemAvailable"] // MIB, meminfo()["MemFree"] // MIB))  # fmt: skip
    try:
        for rep in range(opts.repeat):
            order = opts.strategies[rep % len(opts.strategies) :] + opts.strategies[: rep % len(opts.strategies)]
            loaders = opts.loaders[rep % len(opts.loaders) :] + opts.loaders[: rep % len(opts.loaders)]
            for strategy in order:
                for loader in loaders:
                    run = one_run(strategy, loader, paths, ckpt, bystander, knob, knob_orig, opts)
                    run["repeat"] = rep
                    runs.append(run)
                    log(
                        "rep %d %-16s %-10s load %6.2fs peak %+7.0f MiB guard %5.2f%% (user %.2fs sys %.2fs)"
                        " bystander %5.1f%% %s"
                        % (
                            rep,
                            strategy,
                            loader,
                            run["load_s"],
                            run["peak_growth_mib"],
                            run["guard_cpu_pct"],
                            run.get("guard_user_s", 0.0),
                            run.get("guard_sys_s", 0.0),
                            run["bystander_evicted_pct"],
                            run.get("error", ""),
                        )
                    )
    finally:
        if hog is not None:
            hog.stop()
        write_knob(knob, knob_orig)
        restored = read_knob(knob)
        log("read_ahead_kb restored to %s (was %s)" % (restored, knob_orig))
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result = {
        "benchmark": "page_cache",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *(argv if argv is not None else sys.argv[1:])]),
        "options": {
            "size_gib": opts.size_gib,
            "shards": opts.shards,
            "repeat": opts.repeat,
            "sample_ms": opts.sample_ms,
            "bystander_mib": opts.bystander_mib,
            "dir": opts.dir,
            "guard_args": opts.guard_args,
            "guard_nice": opts.guard_nice,
            "line_mib": opts.line_mib,
            "short_mib": opts.short_mib,
        },
        "machine": machine,
        "duration_s": round(time.monotonic() - started, 1),
        "runs": runs,
    }
    result.update(evaluate(runs, opts.strategies, largest_mib))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    out = opts.output or os.path.join(RESULTS_DIR, "page_cache-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2, sort_keys=True)
        handle.write("\n")
    report(result, opts.json, out)
    recommended = (result["recommended_mode"] or {}).get("mode")
    if recommended and recommended != result["default_mode"]:
        log("note: this run ranks %r first but DEFAULT_MODE is %r" % (recommended, result["default_mode"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
