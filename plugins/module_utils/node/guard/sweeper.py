# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files sweep: fadvise(DONTNEED) over a checkpoint's files, only where it frees something.

Node-side (runs on the node with the stdlib only; shipped beside ``uma_guard.py``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Set, Tuple

from .residency import Residency, fadvise_dontneed, iter_files, read_ahead_kb

MIB = 1 << 20
RESCAN_EVERY_S = 5.0
# Sweeps look at every file at least this often (page faults raise no inotify event).
FULL_SCAN_S = 1.0
# A growing file found mapped (MAPPED_MIN_BYTES stayed resident in a range advised
# away) is probed by advising only this much of its start.
PROBE_BYTES = 4 << 20
MAPPED_MIN_BYTES = 8 << 20
MAX_OPEN_FILES = 512
# Ignore residency changes smaller than this (metadata, a header read).
FILE_STEP_BYTES = 1 << 20
# Readahead window assumed when the device's read_ahead_kb cannot be found.
UNKNOWN_READ_AHEAD_KB = 8192


def keep_bytes(read_ahead_kb: Optional[int]) -> int:
    """Bytes to leave at the end of the resident range of a file being read.

    The kernel keeps up to two readahead windows ahead of a sequential reader
    (the current async part and the next window); evicting them makes the
    reader read them again. Keep two windows plus 1 MiB, at least 4 MiB.
    """
    if read_ahead_kb is None or read_ahead_kb < 0:
        read_ahead_kb = UNKNOWN_READ_AHEAD_KB
    return max(4 * MIB, 2 * read_ahead_kb * 1024 + MIB)


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
