# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which files, on which disk, and how much of each is in the page cache; evicting them.

Node-side (runs on the node with the stdlib only; shipped beside ``uma_guard.py``).
Used by the guard's sweeper, the launcher (pre- and post-load eviction), the
watchdog and the page-cache benchmark.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any, Callable, Iterable, List, Optional, Tuple

try:
    import ctypes
except ImportError:  # pragma: no cover - minimal Pythons
    ctypes = None  # type: ignore[assignment]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# cachestat(2) has the same number on every architecture with the unified
# syscall table (x86_64, aarch64, ...) since Linux 6.5.
NR_CACHESTAT = 451


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
