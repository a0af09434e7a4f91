# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma_guard: hold the page cache down while a model loads on a unified-memory node.

On a node where CPU and GPU share RAM, reading a checkpoint larger than free
memory fills the page cache faster than the GPU driver pins pages, and the
KV-cache allocation that follows fails. This program runs beside the loader
(a third-party program it does not control) and evicts the checkpoint's pages
from the page cache once they have been read. It is bounded: it stops by
itself at ``--max-duration``, when ``--until-url`` answers HTTP 200, or when
``--until-pid`` exits, and it writes a JSON status.

Modes:

``global``
    The published fix: write ``--drop-level`` to ``/proc/sys/vm/drop_caches``
    every tick. Needs root and evicts every other workload's cache too.
``files``
    ``posix_fadvise(POSIX_FADV_DONTNEED)`` over the files under ``--paths``
    every tick, but only for files whose residency (``cachestat(2)``, or
    ``mincore(2)`` on kernels before 6.5) grew: no root, no collateral.
``adaptive`` (the default)
    Reads ``/proc/meminfo`` every tick and acts only when the unmapped file
    cache (``Cached - Mapped``) grew more than ``--threshold-mib`` above its
    running minimum, or ``MemAvailable`` fell below ``--min-available-mib``.
    It acts with the ``files`` sweep when ``--paths`` are given, else with a
    global drop. It wakes at once when the loader opens or reads a watched
    file (inotify), times its ticks to the next threshold crossing while the
    cache grows, and does nothing but one meminfo read per tick on an idle
    node.

Pages mapped by a process (safetensors' ``safe_open`` mmaps each shard) cannot
be evicted by either method, so the floor with an mmap loader is the shard
currently mapped; thresholds therefore use ``Cached - Mapped``. For the file
being read, the sweep leaves the last two readahead windows resident so the
reader never reads them twice. Status and samples are written by a thread:
on a disk saturated by the loader a small write can wait for the journal for
hundreds of milliseconds, which the tick loop must not.

The file is importable (the pure parts are unit-tested) and runnable as
``python3 uma_guard.py ...`` on a node without Ansible (stdlib; psutil is used
when present). Exit codes: 0 normal stop, 1 error stop, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import errno
import json
import os
import select
import signal
import stat
import struct
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

try:
    from ansible_collections.uma.vllm.plugins.module_utils._common import UmaError, atomic_write_json, read_meminfo
except ImportError:  # pragma: no cover - node-side use without Ansible
    from _common import UmaError, atomic_write_json, read_meminfo  # type: ignore[no-redef]

try:
    import psutil  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the node
    psutil = None

try:
    import ctypes
except ImportError:  # pragma: no cover - minimal Pythons
    ctypes = None  # type: ignore[assignment]

MODES = ("global", "files", "adaptive")
# Chosen by benchmarks/page_cache.py (the benchmark reports it as default_mode
# and ranks the modes; see benchmarks/README.md). In the same runs adaptive held
# the mmap loader (vLLM's) at the mapped shard (1.00x) with 0.6% of a core and
# the sequential reader at 50 MiB (files: 147, global: 144 with 5-9% of a core),
# at 1.00x the unguarded load time, and evicted none of a bystander's cache
# (global: all of it). It misses only the 2% CPU target at full disk speed (3.6%).
DEFAULT_MODE = "adaptive"
DEFAULT_INTERVAL = 0.1
MAX_INTERVAL = 60.0
# Sequential readers grow the cache in read()-sized steps (16 MiB in the
# benchmark); 16 lets the guard act after one or two steps. 24 and 32 saved
# 15-30% of the guard's CPU but raised the typical peak by 16 MiB.
DEFAULT_THRESHOLD_MIB = 16
DEFAULT_MIN_AVAILABLE_MIB = 0  # 0 = MemAvailable trigger off
DEFAULT_DROP_LEVEL = 1
DEFAULT_MAX_DURATION = 900.0
STATUS_EVERY_S = 1.0
URL_EVERY_S = 1.0
PID_EVERY_S = 0.2
RESCAN_EVERY_S = 5.0
# Sweeps look at every file at least this often (page faults raise no inotify event).
FULL_SCAN_S = 1.0
# A growing file found mapped (MAPPED_MIN_BYTES stayed resident in a range advised
# away) is probed by advising only this much of its start.
PROBE_BYTES = 4 << 20
MAPPED_MIN_BYTES = 8 << 20
MAX_OPEN_FILES = 512
# Adaptive: shortest tick while the cache grows fast, and how long a kept
# readahead tail may stay before an idle sweep evicts it.
MIN_TICK_S = 0.01
TAIL_CLEANUP_S = 1.0
# Files: ignore residency changes smaller than this (metadata, a header read).
FILE_STEP_BYTES = 1 << 20
# Readahead window assumed when the device's read_ahead_kb cannot be found.
UNKNOWN_READ_AHEAD_KB = 8192
MIB = 1 << 20
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# cachestat(2) has the same number on every architecture with the unified
# syscall table (x86_64, aarch64, ...) since Linux 6.5.
NR_CACHESTAT = 451
STOP_REASONS = ("max_duration", "until_url", "until_pid", "signal")


# --------------------------------------------------------------------------
# Arguments


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message on any bad argument."""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="uma_guard.py",
        description="Hold the page cache down while a model loads (uma.vllm).",
    )
    p.add_argument("--name", required=True, help="name of this guard (status, logs)")
    p.add_argument("--mode", choices=MODES, default=DEFAULT_MODE, help="default: %(default)s")
    p.add_argument("--paths", nargs="+", default=[], metavar="PATH", help="files or directories (recursive)")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, metavar="SEC", help="tick, default 0.1")
    p.add_argument("--threshold-mib", type=int, default=DEFAULT_THRESHOLD_MIB, metavar="N")
    p.add_argument("--min-available-mib", type=int, default=DEFAULT_MIN_AVAILABLE_MIB, metavar="N")
    p.add_argument("--drop-level", type=int, choices=(1, 3), default=DEFAULT_DROP_LEVEL)
    p.add_argument("--max-duration", type=float, default=DEFAULT_MAX_DURATION, metavar="SEC")
    p.add_argument("--until-url", metavar="URL")
    p.add_argument("--until-pid", type=int, metavar="PID")
    p.add_argument("--status-file", metavar="PATH")
    p.add_argument("--samples-file", metavar="PATH")
    p.add_argument("--proc-root", default="/proc", metavar="DIR")
    p.add_argument("--sysfs-root", default="/sys", metavar="DIR")
    return p


def validate(ns: argparse.Namespace) -> Dict[str, Any]:
    """The effective configuration, or UmaError naming the bad option."""
    if not ns.name or not ns.name.strip():
        raise UmaError("--name", ns.name, "is empty", "Give the guard a name, e.g. --name llama-70b.")
    if not 0 < ns.interval <= MAX_INTERVAL:
        raise UmaError("--interval", ns.interval, "must be > 0 and <= 60 seconds", "Use e.g. --interval 0.1.")
    if not ns.max_duration > 0:
        raise UmaError("--max-duration", ns.max_duration, "must be > 0 seconds", "Use e.g. --max-duration 900.")
    if ns.threshold_mib < 1:
        raise UmaError("--threshold-mib", ns.threshold_mib, "must be >= 1", "Use e.g. --threshold-mib 16.")
    if ns.min_available_mib < 0:
        raise UmaError("--min-available-mib", ns.min_available_mib, "must be >= 0", "Use 0 to turn it off.")
    if ns.mode == "files" and not ns.paths:
        raise UmaError("--mode", "files", "needs --paths", "Give the checkpoint directory with --paths DIR.")
    if ns.mode == "global" and ns.paths:
        raise UmaError(
            "--paths",
            ns.paths,
            "has no effect in global mode (it drops every file's cache)",
            "Use --mode files or --mode adaptive to act on these paths only.",
        )
    paths = []
    for path in ns.paths:
        if not os.path.exists(path):
            raise UmaError("--paths", path, "does not exist", "Give existing files or directories.")
        paths.append(os.path.abspath(path))
    if ns.until_url is not None and not ns.until_url.startswith(("http://", "https://")):
        raise UmaError("--until-url", ns.until_url, "is not an http(s) URL", "Use e.g. http://127.0.0.1:8000/health.")
    if ns.until_pid is not None and ns.until_pid <= 0:
        raise UmaError("--until-pid", ns.until_pid, "must be a positive process id", "Give the loader's PID.")
    return {
        "name": ns.name,
        "mode": ns.mode,
        "paths": paths,
        "interval": ns.interval,
        "threshold_mib": ns.threshold_mib,
        "min_available_mib": ns.min_available_mib,
        "drop_level": ns.drop_level,
        "max_duration": ns.max_duration,
        "until_url": ns.until_url,
        "until_pid": ns.until_pid,
        "status_file": os.path.abspath(ns.status_file) if ns.status_file else None,
        "samples_file": os.path.abspath(ns.samples_file) if ns.samples_file else None,
        "proc_root": ns.proc_root,
        "sysfs_root": ns.sysfs_root,
    }


def parse_config(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Parse and validate; exits 2 with the problem and the fix on bad input."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return validate(ns)
    except UmaError as err:
        parser.error(err.message)
    raise AssertionError("unreachable")  # pragma: no cover - parser.error exits


# --------------------------------------------------------------------------
# Memory figures


def cache_view(meminfo: Dict[str, int]) -> Dict[str, int]:
    """The figures the guard uses, in bytes, from a read_meminfo() dict.

    ``unmapped`` is the file cache no process maps (``Cached - Mapped``):
    the part eviction can actually free.
    """
    cached = meminfo.get("Cached", 0)
    mapped = meminfo.get("Mapped", 0)
    return {
        "cached": cached,
        "mapped": mapped,
        "unmapped": max(0, cached - mapped),
        "available": meminfo.get("MemAvailable", meminfo.get("MemFree", 0)),
    }


def sample_record(t: float, meminfo: Dict[str, int]) -> Dict[str, Any]:
    """One line of the samples file (bytes; ``t`` is the Unix time)."""
    record: Dict[str, Any] = {"t": round(t, 3)}
    for key in ("MemAvailable", "Cached", "Mapped", "AnonPages", "Dirty"):
        record[key] = meminfo.get(key, 0)
    return record


class MeminfoReader:
    """/proc/meminfo read cheaply, many times a second.

    ``_common.read_meminfo`` opens the file and parses every line (~0.2 ms
    here); the guard reads meminfo up to 100 times a second while a
    checkpoint streams in, so this keeps /proc/meminfo open, re-reads it with
    pread and picks out only the lines it needs. It falls back to
    read_meminfo when a needed line is missing, and re-opens the file each
    time outside /proc (so tests can replace it).
    """

    KEYS = ("MemFree", "MemAvailable", "Cached", "Mapped", "AnonPages", "Dirty")
    TICK_KEYS = ("MemFree", "MemAvailable", "Cached", "Mapped")
    NEEDED = ("MemFree", "Cached", "Mapped")

    def __init__(self, proc_root: str = "/proc", keys: Iterable[str] = TICK_KEYS) -> None:
        self.proc_root = proc_root
        self.patterns = tuple((key, ("\n%s:" % key).encode("ascii")) for key in keys)
        self.path = os.path.join(proc_root, "meminfo")
        self.keep_open = os.path.realpath(proc_root) == "/proc"
        self.fd: Optional[int] = None

    def _bytes(self) -> bytes:
        if not self.keep_open:
            with open(self.path, "rb") as handle:
                return handle.read()
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return os.pread(self.fd, 65536, 0)

    def read(self) -> Dict[str, int]:
        result = parse_meminfo_fields(b"\n" + self._bytes(), self.patterns)
        for key in self.NEEDED:
            if key not in result:
                return read_meminfo(self.proc_root)
        return result

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def parse_meminfo_fields(data: bytes, patterns: Iterable[Tuple[str, bytes]]) -> Dict[str, int]:
    """Values in bytes of the ``(key, b"\\nKey:")`` lines found in meminfo text."""
    result = {}
    for key, pattern in patterns:
        start = data.find(pattern)
        if start < 0:
            continue
        start += len(pattern)
        stop = data.find(b"\n", start)
        fields = data[start : stop if stop >= 0 else len(data)].split()
        try:
            value = int(fields[0])
        except (ValueError, IndexError):
            continue
        result[key] = value * 1024 if fields[1:2] == [b"kB"] else value
    return result


def next_sleep(unmapped: int, reference: int, threshold: int, rate: float, interval: float) -> float:
    """Adaptive tick: sleep less while the cache grows fast.

    ``rate`` is the unmapped cache growth in bytes/s seen over the last tick.
    The guard looks again when the growth, at that rate, reaches the
    threshold: sleep = headroom / rate, kept between MIN_TICK_S (or
    ``interval`` when smaller) and ``interval``. Each wake-up of a Python
    process costs more CPU than the work it does here, so one look per
    threshold crossing is the aim, not several.
    """
    shortest = min(interval, MIN_TICK_S)
    if rate <= 0:
        return interval
    headroom = reference + threshold - unmapped
    if headroom <= 0:
        return shortest
    return max(shortest, min(interval, headroom / rate))


def keep_bytes(read_ahead_kb: Optional[int]) -> int:
    """Bytes to leave at the end of the resident range of a file being read.

    The kernel keeps up to two readahead windows ahead of a sequential reader
    (the current async part and the next window); evicting them makes the
    reader read them again. Keep two windows plus 1 MiB, at least 4 MiB.
    """
    if read_ahead_kb is None or read_ahead_kb < 0:
        read_ahead_kb = UNKNOWN_READ_AHEAD_KB
    return max(4 * MIB, 2 * read_ahead_kb * 1024 + MIB)


class AdaptivePolicy:
    """When the adaptive mode acts. Pure: fed samples, answers yes/no.

    The reference is the running minimum of the unmapped cache since the
    last action (an action resets it to the level right after acting), so the
    guard reacts to growth, not to a level: cache that other workloads hold
    and that our action cannot free does not make it fire on every tick.
    The MemAvailable trigger backs off (1, 2, 4 ... 30 s) while acting frees
    less than 16 MiB, because then memory is held by something eviction
    cannot touch (the KV cache, anonymous memory).
    """

    BACKOFF_START_S = 1.0
    BACKOFF_MAX_S = 30.0
    USEFUL_BYTES = 16 * MIB

    def __init__(self, threshold_mib: int, min_available_mib: int, start_unmapped: int) -> None:
        self.threshold = threshold_mib * MIB
        self.min_available = min_available_mib * MIB
        self.reference = start_unmapped
        self.backoff = 0.0
        self.not_before = 0.0

    def observe(self, now: float, view: Dict[str, int]) -> Optional[str]:
        """Return the trigger ("growth" or "available") or None."""
        self.reference = min(self.reference, view["unmapped"])
        if view["unmapped"] - self.reference >= self.threshold:
            return "growth"
        if self.min_available and view["available"] < self.min_available and now >= self.not_before:
            return "available"
        return None

    def acted(self, now: float, trigger: str, before: Dict[str, int], after: Dict[str, int]) -> None:
        self.reference = after["unmapped"]
        if trigger == "available":
            freed = after["available"] - before["available"]
            if freed < self.USEFUL_BYTES:
                self.backoff = min(self.BACKOFF_MAX_S, self.backoff * 2 if self.backoff else self.BACKOFF_START_S)
                self.not_before = now + self.backoff
            else:
                self.backoff = 0.0
                self.not_before = 0.0


# --------------------------------------------------------------------------
# Files, devices, residency


def iter_files(paths: Iterable[str]) -> List[Tuple[str, int, int, int]]:
    """Regular files under ``paths`` as (path, size, st_dev, st_ino), de-duplicated.

    Directories are walked recursively; symbolic links to files are followed
    (a Hugging Face snapshot links to blobs) and a file reached twice is
    listed once. Empty files are skipped; unreadable entries are ignored.
    """
    seen = set()
    result = []

    def add(path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return
        key = (st.st_dev, st.st_ino)
        if key in seen:
            return
        seen.add(key)
        result.append((path, st.st_size, st.st_dev, st.st_ino))

    for root in paths:
        if os.path.isdir(root):
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for filename in sorted(filenames):
                    add(os.path.join(dirpath, filename))
        else:
            add(root)
    return result


def block_queue_dir(st_dev: int, sysfs_root: str = "/sys") -> Optional[str]:
    """The ``queue`` directory of the disk holding device ``st_dev``, or None.

    /sys/dev/block/MAJ:MIN links to the device; a partition (it has a
    ``partition`` file) takes the queue of its parent disk. Filesystems
    without a block device (tmpfs, overlay, NFS) give None.
    """
    link = os.path.join(sysfs_root, "dev", "block", "%d:%d" % (os.major(st_dev), os.minor(st_dev)))
    if not os.path.exists(link):
        return None
    device = os.path.realpath(link)
    if os.path.exists(os.path.join(device, "partition")):
        device = os.path.dirname(device)
    queue = os.path.join(device, "queue")
    return queue if os.path.isdir(queue) else None


def read_ahead_kb_file(path: str, sysfs_root: str = "/sys") -> Optional[str]:
    """Path of the read_ahead_kb knob of the disk under ``path``, or None."""
    queue = block_queue_dir(os.stat(path).st_dev, sysfs_root)
    if queue is None:
        return None
    knob = os.path.join(queue, "read_ahead_kb")
    return knob if os.path.exists(knob) else None


def read_ahead_kb(st_dev: int, sysfs_root: str = "/sys") -> Optional[int]:
    queue = block_queue_dir(st_dev, sysfs_root)
    if queue is None:
        return None
    try:
        with open(os.path.join(queue, "read_ahead_kb"), encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def last_resident_end(count_from: Callable[[int], int], npages: int, resolution: int = 64) -> int:
    """Page index just past the last resident page, found by bisection.

    ``count_from(p)`` returns how many pages of [p, EOF) are resident; it
    only grows as p falls, so bisection works. Stops when the bracket is at
    most ``resolution`` pages wide and answers its upper end (never less than
    the truth). Returns 0 when nothing is resident.
    """
    if npages <= 0 or count_from(0) <= 0:
        return 0
    lo, hi = 0, npages  # count_from(lo) > 0; [hi, EOF) is empty
    while hi - lo > max(1, resolution):
        mid = (lo + hi) // 2
        if count_from(mid) > 0:
            lo = mid
        else:
            hi = mid
    return hi


class Residency:
    """How many pages of a file are in the page cache.

    cachestat(2) (Linux >= 6.5) answers for a 1 GiB file in ~0.01-0.3 ms
    here; mincore(2) over a shared mapping costs ~10 ms per GiB, so it is the
    fallback (kernels before 6.5, or a seccomp filter that refuses the call).
    ``method`` is "cachestat", "mincore" or "none".
    """

    # how far a resident-end hint may lie above the truth and still be used
    HINT_SLACK = 1 << 20

    def __init__(self, page_size: int = PAGE_SIZE, prefer: Optional[str] = None) -> None:
        self.page_size = page_size
        self.method = "none"
        self._libc: Any = None
        if ctypes is None:
            return
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
        except OSError:  # pragma: no cover - no libc (not Linux)
            return
        for method in [prefer] if prefer else ["cachestat", "mincore"]:
            if method == "cachestat" and self._setup_cachestat():
                self.method = "cachestat"
                break
            if method == "mincore" and hasattr(self._libc, "mincore"):
                self._setup_mincore()
                self.method = "mincore"
                break

    # -- cachestat
    def _setup_cachestat(self) -> bool:
        class Range(ctypes.Structure):
            _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

        class Stat(ctypes.Structure):
            _fields_ = [
                ("nr_cache", ctypes.c_uint64),
                ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64),
                ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64),
            ]

        # one syscall entry point with fixed argument types and reused
        # structures: the ctypes overhead is most of the cost of a call
        self._cs_call = ctypes.CFUNCTYPE(
            ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, use_errno=True
        )(("syscall", self._libc))
        self._cs_range = Range()
        self._cs_stat = Stat()
        self._cs_range_p = ctypes.addressof(self._cs_range)
        self._cs_stat_p = ctypes.addressof(self._cs_stat)
        # probe on a file that surely exists; ENOSYS (old kernel) or EPERM
        # (seccomp in a container) mean "use mincore"
        for probe in (os.path.abspath(__file__), sys.executable):
            try:
                fd = os.open(probe, os.O_RDONLY)
            except OSError:
                continue
            try:
                return self._cachestat(fd, 0) is not None
            finally:
                os.close(fd)
        return False

    def _cachestat(self, fd: int, offset: int) -> Optional[int]:
        """Resident pages of [offset, EOF)."""
        self._cs_range.off = offset
        self._cs_range.len = 0
        if self._cs_call(NR_CACHESTAT, fd, self._cs_range_p, self._cs_stat_p, 0) != 0:
            return None
        return int(self._cs_stat.nr_cache)

    # -- mincore
    def _setup_mincore(self) -> None:
        libc = self._libc
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]

    def _mincore_vector(self, fd: int, size: int) -> Optional[bytes]:
        import mmap

        libc = self._libc
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            npages = (size + self.page_size - 1) // self.page_size
            chunk = 1 << 18
            parts = []
            for first in range(0, npages, chunk):
                count = min(chunk, npages - first)
                vec = ctypes.create_string_buffer(count)
                if libc.mincore(ctypes.c_void_p(addr + first * self.page_size), count * self.page_size, vec) != 0:
                    return None
                parts.append(vec.raw)
            return b"".join(parts)
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)

    # -- public
    def pages(self, fd: int, size: int, offset: int = 0) -> Optional[int]:
        """Resident pages of [offset, EOF), None when unknown."""
        if size <= 0:
            return 0
        if self.method == "cachestat":
            return self._cachestat(fd, offset)
        if self.method == "mincore":
            vec = self._mincore_vector(fd, size)
            if vec is None:
                return None
            return _count_resident(vec[offset // self.page_size :])
        return None

    def resident_bytes(self, fd: int, size: int) -> Optional[int]:
        pages = self.pages(fd, size)
        return None if pages is None else min(size, pages * self.page_size)

    def resident_end(self, fd: int, size: int, hint: Optional[int] = None) -> int:
        """Byte offset just past the last resident page (0 when none).

        ``hint`` (a guess from the last sweep) is used when no page lies at or
        above it and some page lies within HINT_SLACK below it: two calls
        instead of a bisection.
        """
        npages = (size + self.page_size - 1) // self.page_size
        if self.method == "cachestat":
            if hint is not None and self.HINT_SLACK < hint < size:
                hint -= hint % self.page_size
                if not self._cachestat(fd, hint) and self._cachestat(fd, hint - self.HINT_SLACK):
                    return hint
            end = last_resident_end(lambda p: self._cachestat(fd, p * self.page_size) or 0, npages)
        elif self.method == "mincore":
            vec = self._mincore_vector(fd, size)
            if vec is None:
                return size
            end = len(vec.rstrip(b"\x00"))
        else:
            return size
        return min(size, end * self.page_size)


def _count_resident(vec: bytes) -> int:
    # mincore sets bit 0 per resident page; the other bits are reserved (0)
    return len(vec) - vec.count(b"\x00")


def file_residency(path: str, residency: Optional[Residency] = None) -> Tuple[int, int]:
    """(resident bytes, size) of one file; used by the tests and the benchmark."""
    residency = residency or Residency()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        resident = residency.resident_bytes(fd, size)
        if resident is None:
            raise OSError("no way to measure page-cache residency here (no cachestat or mincore)")
        return resident, size
    finally:
        os.close(fd)


def fadvise_dontneed(fd: int, offset: int = 0, length: int = 0) -> None:
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def evict_paths(paths: Iterable[str]) -> Tuple[int, int]:
    """posix_fadvise(DONTNEED) over each file once: (bytes asked to go, files advised).
    A file that cannot be opened is passed over (gone, or not readable)."""
    total, files = 0, 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            total += os.fstat(fd).st_size
            fadvise_dontneed(fd)
            files += 1
        finally:
            os.close(fd)
    return total, files


class FileSweeper:
    """fadvise(DONTNEED) over the files under the given paths, cost-aware.

    Per file it remembers what stayed resident after the last full eviction
    (the ``floor``: pages some process maps) and what it saw last time. A
    file is advised only when its residency exceeds the floor by more than
    FILE_STEP_BYTES. For a file whose residency grew since the last look (the
    one being read now) the last ``keep_bytes(read_ahead_kb)`` of its resident
    range stay, so the reader's readahead is not thrown away and read again;
    the next sweep that finds the file no longer growing evicts it whole.

    A sweep looks only at the candidates: files the loader touched since the
    last sweep (inotify), files that still held pages last time, and every
    file once per FULL_SCAN_S (page faults in a mapping raise no event), so
    its cost follows the files in use, not the size of the checkpoint. The
    files stay open (up to MAX_OPEN_FILES) so the guard's own opens raise no
    events.
    """

    def __init__(self, paths: List[str], sysfs_root: str = "/sys", residency: Optional[Residency] = None) -> None:
        self.paths = paths
        self.sysfs_root = sysfs_root
        self.residency = residency or Residency()
        self.files: List[Tuple[str, int, int, int]] = []
        self.state: Dict[Tuple[int, int], Dict[str, Any]] = {}
        self.fds: Dict[Tuple[int, int], int] = {}
        self.keep_by_dev: Dict[int, int] = {}
        self.scanned_at: Optional[float] = None
        self.full_at: Optional[float] = None
        self.tails = False
        self.sweeps = 0
        self.checks = 0
        self.warnings: List[str] = []
        self.max_open = _max_open_files()

    def rescan(self, now: float) -> None:
        self.files = iter_files(self.paths)
        self.scanned_at = now
        live = {(entry[2], entry[3]) for entry in self.files}
        for key in list(self.state):
            if key not in live:
                del self.state[key]
        for key in list(self.fds):
            if key not in live:  # deleted or replaced: let its space go
                os.close(self.fds.pop(key))
        for path, _size, dev, ino in self.files:
            if len(self.fds) >= self.max_open:
                break
            if (dev, ino) not in self.fds:
                try:
                    self.fds[(dev, ino)] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                except OSError as err:
                    self._warn("%s: %s" % (path, err.strerror))

    def due_rescan(self, now: float) -> bool:
        return self.scanned_at is None or now - self.scanned_at >= RESCAN_EVERY_S

    def keep(self, st_dev: int) -> int:
        if st_dev not in self.keep_by_dev:
            self.keep_by_dev[st_dev] = keep_bytes(read_ahead_kb(st_dev, self.sysfs_root))
        return self.keep_by_dev[st_dev]

    def candidate(self, key: Tuple[int, int], touched: Optional[Set[Tuple[int, int]]]) -> bool:
        if touched is None or key in touched:
            return True
        st = self.state.get(key)
        return st is None or st["tail"] or st["seen"] > st["floor"] + FILE_STEP_BYTES

    def sweep(self, now: float, touched: Optional[Set[Tuple[int, int]]] = None) -> Tuple[int, int]:
        """One pass; returns (files advised, bytes evicted).

        ``touched`` is the set of (st_dev, st_ino) the loader used since the
        last sweep, or None to look at every file.
        """
        if self.due_rescan(now):
            self.rescan(now)
        if self.full_at is None or now - self.full_at >= FULL_SCAN_S:
            touched = None
        if touched is None:
            self.full_at = now
        self.sweeps += 1
        actions = 0
        evicted = 0
        tails = False
        for path, size, dev, ino in self.files:
            key = (dev, ino)
            if not self.candidate(key, touched):
                continue
            st = self.state.setdefault(key, {"floor": 0, "seen": 0, "tail": False, "end": None})
            self.checks += 1
            fd = self.fds.get(key)
            try:
                own = fd is None
                if own:
                    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    done, freed, kept = self.advise(fd, size, dev, st)
                finally:
                    if own:
                        os.close(fd)
            except OSError as err:
                self._warn("%s: %s" % (path, err.strerror))
                continue
            actions += done
            evicted += freed
            tails = tails or kept
        self.tails = tails
        return actions, evicted

    def advise(self, fd: int, size: int, dev: int, st: Dict[str, Any]) -> Tuple[int, int, bool]:
        """Evict what is worth it of one open file; returns (advised 0/1, bytes freed, tail kept).

        A growing file whose pages below the kept tail stayed resident after
        the last advice is mapped by its loader (an mmap loader faulting it
        in). Advising it again frees nothing and costs a walk over every
        mapped page (~80 ms per GiB with small folios), so while it keeps
        growing only its first PROBE_BYTES are advised: once they go, the
        loader has unmapped it and the whole file is advised.
        """
        before = self.residency.resident_bytes(fd, size)
        if before is None:  # no residency method: advise the whole file, count unknown
            fadvise_dontneed(fd)
            return 1, 0, False
        if before <= st["floor"] + FILE_STEP_BYTES and not st["tail"]:
            st["seen"] = before
            return 0, 0, False
        end = size
        grew = before > st["seen"] + FILE_STEP_BYTES  # someone reads it now
        if grew and st.get("mapped"):
            if self.still_mapped(fd, size, before):
                st["seen"] = before
                st["tail"] = True
                return 0, 0, True
            st["mapped"] = False
            grew = False  # unmapped since: it is done, advise it whole
        if grew:
            hint = st["end"] + (before - st["seen"]) if st["end"] else None
            resident_end = self.residency.resident_end(fd, size, hint)
            st["end"] = resident_end
            end = max(0, resident_end - self.keep(dev))
            end -= end % self.residency.page_size
        if end <= 0:
            st["seen"] = before
            st["tail"] = True
            return 0, 0, True
        fadvise_dontneed(fd, 0, 0 if end >= size else end)
        after = self.residency.resident_bytes(fd, size) or 0
        freed = max(0, before - after)
        st["seen"] = after
        st["tail"] = end < size
        if end >= size:
            st["floor"] = after
            st["end"] = None
            st["mapped"] = False
        else:
            # what stayed resident in the advised range [0, end) is mapped (or locked for I/O, a little)
            tail = self.residency.pages(fd, size, end)
            st["mapped"] = tail is not None and after - tail * self.residency.page_size >= MAPPED_MIN_BYTES
        return 1, freed, end < size

    def still_mapped(self, fd: int, size: int, before: int) -> bool:
        """Advise the first PROBE_BYTES; True when they stay resident (still mapped)."""
        probe = min(size, PROBE_BYTES)
        beyond = self.residency.pages(fd, size, probe)
        if beyond is None:
            return True
        head = before - beyond * self.residency.page_size
        if head < probe // 4:
            return False  # the start is not resident: no evidence, advise as usual
        fadvise_dontneed(fd, 0, probe)
        after = self.residency.resident_bytes(fd, size) or 0
        return before - after < head // 2

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def _warn(self, text: str) -> None:
        if text not in self.warnings and len(self.warnings) < 20:
            self.warnings.append(text)


def _max_open_files() -> int:
    """How many checkpoint files the guard keeps open: MAX_OPEN_FILES, or less than half the fd limit."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return MAX_OPEN_FILES
    except (ImportError, ValueError, OSError):
        soft = 1024
    return max(0, min(MAX_OPEN_FILES, soft // 2 - 16))


class FileEvents:
    """inotify on the files (open, read, close): which files the loader uses, and when.

    A loader opening the next shard (an mmap loader has just unmapped the last
    one) or reading with read() produces an event, so the adaptive guard
    looks at meminfo right then instead of at its next tick, and a sweep
    checks only the files in use. Page faults in a mapping produce no event;
    the tick and the periodic full scan cover those. ``fd`` is None when
    inotify is unavailable; every sweep then looks at every file.
    """

    MASK = 0x00000001 | 0x00000020 | 0x00000010  # IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE
    IN_Q_OVERFLOW = 0x00004000
    _HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        self.watched = 0
        self.full = False
        self.events = 0
        self.keys: Dict[int, Tuple[int, int]] = {}  # watch descriptor -> (st_dev, st_ino)
        if ctypes is None:
            return
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self.fd = fd
            self._libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]

    def watch(self, files: Iterable[Tuple[str, int, int, int]]) -> None:
        """Watch (path, size, st_dev, st_ino) entries; a file already watched keeps its descriptor."""
        if self.fd is None or self.full:
            return
        for path, _size, dev, ino in files:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), self.MASK)
            if wd < 0:
                self.full = ctypes.get_errno() == 28  # ENOSPC: fs.inotify.max_user_watches reached
                if self.full:
                    break
                continue
            self.keys[wd] = (dev, ino)
        self.watched = len(set(self.keys.values()))

    def drain(self) -> Optional[Set[Tuple[int, int]]]:
        """Read the pending events: the files touched, or None when events were lost."""
        touched: Set[Tuple[int, int]] = set()
        if self.fd is None:
            return touched
        lost = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            self.events += 1
            offset = 0
            while offset + self._HEADER.size <= len(data):
                wd, mask, _cookie, length = self._HEADER.unpack_from(data, offset)
                offset += self._HEADER.size + length
                if mask & self.IN_Q_OVERFLOW:
                    lost = True
                elif wd in self.keys:
                    touched.add(self.keys[wd])
        return None if lost else touched

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# --------------------------------------------------------------------------
# Stop conditions


def proc_start_time(pid: int, proc_root: str = "/proc") -> Optional[Tuple[int, str]]:
    """(start time in clock ticks, state letter) of ``pid``, None if it does not exist."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    # the command name is in parentheses and may contain spaces or ')'
    rest = text[text.rfind(")") + 2 :].split()
    if len(rest) < 20:
        return None
    try:
        return int(rest[19]), rest[0]
    except ValueError:
        return None


class PidWatch:
    """Has the process exited? A zombie or a reused PID counts as exited."""

    def __init__(self, pid: int, proc_root: str = "/proc") -> None:
        self.pid = pid
        self.proc_root = proc_root
        self.use_psutil = psutil is not None and proc_root == "/proc"
        self.start = self._identity()

    def _identity(self) -> Any:
        if self.use_psutil:
            try:
                proc = psutil.Process(self.pid)
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return None
                return proc.create_time()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                return None
        found = proc_start_time(self.pid, self.proc_root)
        if found is None or found[1] in ("Z", "X"):
            return None
        return found[0]

    def exited(self) -> bool:
        if self.start is None:
            return True
        return self._identity() != self.start


class UrlWatch:
    """Polls ``url`` at most every URL_EVERY_S in a daemon thread; ``ready`` is set on HTTP 200.

    The request runs in its own thread so a slow server never delays a tick.
    """

    def __init__(self, url: str, every: float = URL_EVERY_S) -> None:
        import urllib.request

        self.url = url
        self.every = every
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.checks = 0
        self.last_error: Optional[str] = None
        # health checks go to the node itself: never through an HTTP proxy
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._thread = threading.Thread(target=self._run, name="uma-guard-url", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def check(self) -> bool:
        self.checks += 1
        try:
            with self._opener.open(self.url, timeout=max(0.2, self.every)) as response:
                ok = response.status == 200
                self.last_error = None if ok else "HTTP %d" % response.status
                return ok
        except Exception as err:  # any failure means "not ready yet"
            self.last_error = str(err)[:200]
            return False

    def _run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            if self.check():
                self.ready.set()
                return
            self.stopping.wait(max(0.0, self.every - (time.monotonic() - started)))


def cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------
# The guard


def open_samples(path: str) -> Any:
    """The samples file, opened so that a root guard cannot be turned against another file.

    The directory must belong to the guard's user and be writable by nobody else (no /tmp),
    and the file itself is opened with O_NOFOLLOW: a symlink planted there is refused.
    """
    directory = os.path.dirname(os.path.abspath(path))
    info = os.stat(directory)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(
            errno.EPERM,
            "samples file %s: its directory must belong to uid %d and be writable by nobody else"
            " (give a file in e.g. /run/uma-vllm or /var/lib/uma-vllm)" % (path, os.geteuid()),
        )
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o640)
    return os.fdopen(fd, "w", encoding="ascii")


class Writer:
    """Writes the status file and the samples file from a background thread.

    On a disk saturated by the loader, even a small write and rename can wait
    for the filesystem journal for hundreds of milliseconds (seen here: 600
    ms, during which the cache grew by 650 MiB). The tick loop only hands
    over data; this thread does the I/O.
    """

    def __init__(self, status_file: Optional[str], samples_file: Optional[str]) -> None:
        self.status_file = status_file
        self.samples_handle: Any = open_samples(samples_file) if samples_file else None
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()  # orders the thread's status writes before the final one
        self._final = False
        self._wake = threading.Event()
        self._status: Optional[Dict[str, Any]] = None
        self._lines: List[str] = []
        self._closing = False
        self.errors: List[str] = []
        self._thread = threading.Thread(target=self._run, name="uma-guard-writer", daemon=True)
        self._thread.start()

    def status(self, data: Dict[str, Any]) -> None:
        with self._lock:
            self._status = data
        self._wake.set()

    def sample(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def _flush(self) -> None:
        with self._lock:
            status, self._status = self._status, None
            lines, self._lines = self._lines, []
        if lines and self.samples_handle is not None:
            try:
                self.samples_handle.write("".join(lines))
                self.samples_handle.flush()
            except OSError as err:
                self._error("samples %s: %s" % (self.samples_handle.name, err))
        if status is not None and self.status_file:
            with self._io_lock:
                if self._final:
                    return
                try:
                    _replace_file(self.status_file, json.dumps(status, indent=2, sort_keys=True) + "\n")
                except OSError as err:
                    self._error("status %s: %s" % (self.status_file, err))

    def _error(self, text: str) -> None:
        if len(self.errors) < 5:
            self.errors.append(text)
            sys.stderr.write("uma_guard: cannot write %s\n" % text)

    def _run(self) -> None:
        while not self._closing:
            self._wake.wait()
            self._wake.clear()
            self._flush()

    def final(self, data: Dict[str, Any]) -> bool:
        """The last status, durable; no running update can land after it."""
        with self._io_lock:
            self._final = True
            return _write_status(self.status_file, data)

    def close(self, timeout: float = 5.0) -> None:
        """Write the pending samples and stop the thread."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        with self._lock:
            self._status = None  # superseded by the final status
        self._flush()
        if self.samples_handle is not None:
            try:
                self.samples_handle.close()
            except OSError:
                pass
            self.samples_handle = None


class Guard:
    """State and one tick of the guard. ``run()`` drives it; tests call ``tick``."""

    def __init__(self, config: Dict[str, Any], clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.mode = config["mode"]
        self.proc_root = config["proc_root"]
        self.drop_path = os.path.join(self.proc_root, "sys", "vm", "drop_caches")
        self.sweeper = FileSweeper(config["paths"], config["sysfs_root"]) if config["paths"] else None
        self.events: Optional[FileEvents] = None
        # files the loader used since the last sweep (None: unknown, look at all)
        self.touched: Optional[Set[Tuple[int, int]]] = None
        # the samples file wants every timeline key; a tick needs only four
        keys = MeminfoReader.KEYS if config.get("samples_file") else MeminfoReader.TICK_KEYS
        self.reader = MeminfoReader(self.proc_root, keys)
        self.started_mono = clock()
        self.started_at = utc_now()
        self.stopped_at: Optional[str] = None
        self.stop_reason: Optional[str] = None
        self.ticks = 0
        self.evictions = 0
        self.evicted_bytes = 0
        self.triggers: Dict[str, int] = {}
        self.writer: Optional[Writer] = None
        self.last_tick = self.started_mono
        meminfo = read_meminfo(self.proc_root)
        view = cache_view(meminfo)
        self.baseline = view
        self.peak_cached = view["cached"]
        self.peak_unmapped = view["unmapped"]
        self.peak_mapped = view["mapped"]
        self.min_available = view["available"]
        self.prev_unmapped = view["unmapped"]
        self.rate = 0.0
        self.last_sweep = self.started_mono
        self.policy = AdaptivePolicy(config["threshold_mib"], config["min_available_mib"], view["unmapped"])

    # -- checks before running
    def preflight(self) -> None:
        """Raise OSError when the mode cannot work on this node."""
        needs_drop = self.mode == "global" or (self.mode == "adaptive" and self.sweeper is None)
        if needs_drop and not os.access(self.drop_path, os.W_OK):
            raise OSError(
                "%s is not writable: mode %s without --paths drops caches globally and needs root; "
                "give --paths to use fadvise instead" % (self.drop_path, self.mode)
            )
        if self.sweeper is not None:
            self.sweeper.rescan(self.clock())
            self.events = FileEvents()
            self.events.watch(self.sweeper.files)

    def close(self) -> None:
        self.reader.close()
        if self.events is not None:
            self.events.close()
        if self.sweeper is not None:
            self.sweeper.close()
        if self.writer is not None:
            self.writer.close()

    # -- sampling
    def _sample(self) -> Dict[str, int]:
        meminfo = self.reader.read()
        view = cache_view(meminfo)
        self.peak_cached = max(self.peak_cached, view["cached"])
        self.peak_unmapped = max(self.peak_unmapped, view["unmapped"])
        self.peak_mapped = max(self.peak_mapped, view["mapped"])
        self.min_available = min(self.min_available, view["available"])
        if self.writer is not None and self.writer.samples_handle is not None:
            self.writer.sample(json.dumps(sample_record(time.time(), meminfo), sort_keys=True) + "\n")
        return view

    # -- actions
    def drop_global(self) -> None:
        with open(self.drop_path, "w", encoding="ascii") as handle:
            handle.write("%d\n" % self.config["drop_level"])

    def _act(self, now: float, before: Dict[str, int], use_files: bool) -> Dict[str, int]:
        if use_files and self.sweeper is not None:
            actions, freed = self.sweeper.sweep(now, self.touched)
            self.touched = set()
            self.evictions += actions
            self.evicted_bytes += freed
            self.last_sweep = now
            if not freed:
                return before
            # what the sweep freed was unmapped file cache: no second meminfo read
            after = dict(before)
            after["cached"] = max(0, before["cached"] - freed)
            after["unmapped"] = max(0, before["unmapped"] - freed)
            after["available"] = before["available"] + freed
            return after
        self.drop_global()
        after = self._sample()
        self.evictions += 1
        self.evicted_bytes += max(0, before["cached"] - after["cached"])
        return after

    def tick(self) -> float:
        """Sample, act if the mode says so; returns how long to sleep at most."""
        now = self.clock()
        self.ticks += 1
        if self.events is not None and self.sweeper is not None:
            if self.sweeper.due_rescan(now):
                self.sweeper.rescan(now)  # new files (a download finishing) get watched too
                self.events.watch(self.sweeper.files)
            touched = self.events.drain() if self.events.fd is not None else None
            if touched is None or self.touched is None:
                self.touched = None
            else:
                self.touched |= touched
        view = self._sample()
        dt = max(1e-6, now - self.last_tick)
        self.rate = (view["unmapped"] - self.prev_unmapped) / dt
        self.last_tick = now
        interval = self.config["interval"]
        if self.mode == "global":
            view = self._act(now, view, use_files=False)
        elif self.mode == "files":
            view = self._act(now, view, use_files=True)
        else:
            trigger = self.policy.observe(now, view)
            if trigger is not None:
                self.triggers[trigger] = self.triggers.get(trigger, 0) + 1
                after = self._act(now, view, use_files=self.sweeper is not None)
                self.policy.acted(now, trigger, view, after)
                view = after
            elif self.sweeper is not None and self.sweeper.tails and now - self.last_sweep >= TAIL_CLEANUP_S:
                # a readahead tail kept by the last sweep outlived the read: evict it now
                self.triggers["tail"] = self.triggers.get("tail", 0) + 1
                after = self._act(now, view, use_files=True)
                self.policy.acted(now, "tail", view, after)
                view = after
        self.prev_unmapped = view["unmapped"]
        if self.mode != "adaptive":
            return interval
        return next_sleep(view["unmapped"], self.policy.reference, self.policy.threshold, self.rate, interval)

    # -- status
    def status(self, state: str) -> Dict[str, Any]:
        base = self.baseline
        result = {
            "name": self.config["name"],
            "mode": self.mode,
            "pid": os.getpid(),
            "state": state,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
            "elapsed_s": round(self.clock() - self.started_mono, 3),
            "ticks": self.ticks,
            "evictions": self.evictions,
            "evicted_bytes": self.evicted_bytes,
            "baseline_cache_mib": _mib(base["cached"]),
            "peak_cache_mib": _mib(self.peak_cached),
            "peak_growth_mib": _mib(self.peak_cached - base["cached"]),
            "peak_mapped_mib": _mib(self.peak_mapped),
            "min_available_mib": _mib(self.min_available),
            "baseline_unmapped_mib": _mib(base["unmapped"]),
            "peak_unmapped_growth_mib": _mib(self.peak_unmapped - base["unmapped"]),
            "cpu_seconds": round(cpu_seconds(), 3),
            "stop_reason": self.stop_reason,
            "triggers": dict(self.triggers),
            "config": dict(self.config),
        }
        if self.sweeper is not None:
            result["files"] = len(self.sweeper.files)
            result["sweeps"] = self.sweeper.sweeps
            result["file_checks"] = self.sweeper.checks
            result["residency_method"] = self.sweeper.residency.method
            result["warnings"] = list(self.sweeper.warnings)
        if self.events is not None:
            result["inotify_watches"] = self.events.watched
            result["inotify_batches"] = self.events.events
        return result


def _mib(value: float) -> float:
    return round(value / MIB, 1)


class Stopper:
    """Stop request shared by signal handlers, tests and the wait in the loop.

    A self-pipe makes a signal end a wait at once, whatever the interval.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal: Optional[int] = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def handler(self, signum: int, _frame: Any) -> None:
        self.signal = signum
        self.set()

    def set(self) -> None:
        self.requested = True
        try:
            os.write(self._w, b"x")
        except OSError:  # pipe full: a wake-up is already pending
            pass

    def wait(self, timeout: float, fd: Optional[int] = None) -> bool:
        """Sleep up to ``timeout``; True when ``fd`` became readable."""
        if self.requested:
            return False
        rlist = [self._r] if fd is None else [self._r, fd]
        ready = select.select(rlist, [], [], max(0.0, timeout))[0]
        return fd is not None and fd in ready

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


def run(config: Dict[str, Any], stop: Optional[Stopper] = None, clock: Callable[[], float] = time.monotonic) -> int:
    """Run the guard until a stop condition; returns the exit code (0 or 1)."""
    stop = stop or Stopper()
    status_file = config.get("status_file")
    try:
        guard = Guard(config, clock)
    except OSError as err:
        _report_early_error(config, "error: cannot read memory figures: %s" % err)
        return 1
    url_watch: Optional[UrlWatch] = None
    code = 0
    last_status = -1e9
    last_pid = -1e9
    try:
        guard.preflight()
        guard.writer = Writer(status_file, config.get("samples_file"))
        pid_watch = PidWatch(config["until_pid"], config["proc_root"]) if config.get("until_pid") else None
        if config.get("until_url"):
            url_watch = UrlWatch(config["until_url"])
            url_watch.start()
        while True:
            now = clock()
            if stop.requested:
                guard.stop_reason = "signal"
            elif now - guard.started_mono >= config["max_duration"]:
                guard.stop_reason = "max_duration"
            elif url_watch is not None and url_watch.ready.is_set():
                guard.stop_reason = "until_url"
            elif pid_watch is not None and now - last_pid >= PID_EVERY_S:
                last_pid = now
                if pid_watch.exited():
                    guard.stop_reason = "until_pid"
            if guard.stop_reason:
                break
            sleep = guard.tick()
            if now - last_status >= STATUS_EVERY_S:
                last_status = now
                guard.writer.status(guard.status("running"))
            sleep = min(sleep, max(0.0, config["max_duration"] - (clock() - guard.started_mono)))
            if pid_watch is not None:
                sleep = min(sleep, PID_EVERY_S)
            watch = guard.mode == "adaptive" and guard.events is not None and guard.events.fd is not None
            if watch and sleep >= config["interval"]:
                # no growth in sight: wake at once on file activity (a loader opening
                # the next shard, or starting to read), at most every MIN_TICK_S
                if stop.wait(sleep, guard.events.fd):
                    stop.wait(MIN_TICK_S - (clock() - now))
            else:
                # the cache grows (or files/global mode): the tick is timed
                stop.wait(sleep)
    except (OSError, ValueError) as err:
        guard.stop_reason = "error: %s" % err
        code = 1
    finally:
        if url_watch is not None:
            url_watch.stop()
        guard.close()
    guard.stopped_at = utc_now()
    final = guard.status("stopped")
    if url_watch is not None:
        final["url_checks"] = url_watch.checks
        final["url_last_error"] = url_watch.last_error
    if guard.writer is not None:
        final["write_errors"] = list(guard.writer.errors)
    written = guard.writer.final(final) if guard.writer is not None else _write_status(status_file, final)
    if not written:
        code = code or 1
    if code:
        sys.stderr.write("uma_guard %s: %s\n" % (config["name"], guard.stop_reason))
    return code


def _write_status(path: Optional[str], data: Dict[str, Any]) -> bool:
    """The final status: atomic and durable (fsync). Running updates go through Writer."""
    if not path:
        return True
    try:
        atomic_write_json(path, data)
        return True
    except OSError as err:
        sys.stderr.write("uma_guard: cannot write status %s: %s\n" % (path, err))
        return False


def _replace_file(path: str, content: str) -> None:
    """Atomic replace without fsync: readers see the whole old or new file."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _report_early_error(config: Dict[str, Any], reason: str) -> None:
    sys.stderr.write("uma_guard %s: %s\n" % (config["name"], reason))
    now = utc_now()
    _write_status(
        config.get("status_file"),
        {
            "name": config["name"],
            "mode": config["mode"],
            "pid": os.getpid(),
            "state": "stopped",
            "started_at": now,
            "stopped_at": now,
            "elapsed_s": 0.0,
            "ticks": 0,
            "evictions": 0,
            "evicted_bytes": 0,
            "cpu_seconds": round(cpu_seconds(), 3),
            "stop_reason": reason,
            "config": config,
        },
    )


def main(argv: Optional[List[str]] = None) -> int:
    config = parse_config(argv)
    stop = Stopper()
    signal.signal(signal.SIGTERM, stop.handler)
    signal.signal(signal.SIGINT, stop.handler)
    try:
        return run(config, stop)
    finally:
        stop.close()


if __name__ == "__main__":
    raise SystemExit(main())
