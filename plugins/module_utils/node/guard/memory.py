# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard's memory figures and the adaptive mode's policy: when to act, how long to sleep.

Node-side (runs on the node with the stdlib only; shipped beside ``uma_guard.py``).
Pure apart from :class:`MeminfoReader`, which reads ``/proc/meminfo``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Optional, Tuple

from ..base.common import read_meminfo

MIB = 1 << 20
# Adaptive: shortest tick while the cache grows fast.
MIN_TICK_S = 0.01


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
        "free": meminfo.get("MemFree", 0),
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
    return sleep_until(reference + threshold - unmapped, rate, interval)


def sleep_until(headroom: float, rate: float, interval: float) -> float:
    """How long until ``headroom`` bytes are used up at ``rate`` bytes/s, in [min(interval, MIN_TICK_S), interval]."""
    shortest = min(interval, MIN_TICK_S)
    if rate <= 0:
        return interval
    if headroom <= 0:
        return shortest
    return max(shortest, min(interval, headroom / rate))


class AdaptivePolicy:
    """When the adaptive mode acts. Pure: fed samples, answers yes/no.

    The reference is the running minimum of the unmapped cache since the
    last action (an action resets it to the level right after acting), so the
    guard reacts to growth, not to a level: cache that other workloads hold
    and that our action cannot free does not make it fire on every tick.
    The MemAvailable trigger backs off (1, 2, 4 ... 30 s) while acting frees
    less than 16 MiB, because then memory is held by something eviction
    cannot touch (the KV cache, anonymous memory).

    With ``act_below_free_mib`` the growth trigger is held while ``MemFree`` is at or above it:
    the cache then sits in memory nobody asked for, and evicting it would only spend the kernel's
    CPU. The reference is not moved while held, so the first tick below the line acts on all the
    growth since the last action.
    """

    BACKOFF_START_S = 1.0
    BACKOFF_MAX_S = 30.0
    USEFUL_BYTES = 16 * MIB

    def __init__(
        self, threshold_mib: int, min_available_mib: int, start_unmapped: int, act_below_free_mib: int = 0
    ) -> None:
        self.threshold = threshold_mib * MIB
        self.min_available = min_available_mib * MIB
        self.act_below_free = act_below_free_mib * MIB
        self.reference = start_unmapped
        self.backoff = 0.0
        self.not_before = 0.0
        self.held = False  # this tick's growth was held by act_below_free
        self.held_ticks = 0

    def observe(self, now: float, view: Dict[str, int]) -> Optional[str]:
        """Return the trigger ("growth" or "available") or None."""
        self.reference = min(self.reference, view["unmapped"])
        self.held = False
        if view["unmapped"] - self.reference >= self.threshold:
            if not self.act_below_free or view["free"] < self.act_below_free:
                return "growth"
            self.held = True
            self.held_ticks += 1
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


MCL_CURRENT = 1
MCL_ONFAULT = 4


def lock_own_memory(status_path: str = "/proc/self/status") -> Tuple[Optional[int], Optional[str]]:
    """mlockall(MCL_CURRENT | MCL_ONFAULT): the pages this process has touched stay in RAM.

    Under memory pressure the kernel reclaims the guard's own code and data and the guard then
    spends its CPU reading them back (seen in the VM lab: 9085 major faults, 21 s of system time
    in one launch), just when it should act. ONFAULT locks only what is touched, so a large mapping
    (the locale archive) is not read in whole; mappings made later (the mincore windows over the
    checkpoint) are not locked. Returns (VmLck KiB, None) or (None, the reason it could not).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mlockall(MCL_CURRENT | MCL_ONFAULT) != 0:
            err = ctypes.get_errno()
            return None, "mlockall: %s (needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK)" % os.strerror(err)
    except (ImportError, OSError, AttributeError) as exc:
        return None, "mlockall: %s" % exc
    try:
        with open(status_path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("VmLck:"):
                    return int(line.split()[1]), None
    except (OSError, ValueError, IndexError):
        pass
    return 0, None
