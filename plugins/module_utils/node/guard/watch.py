# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the guard watches: the checkpoint's files (inotify), the loader's PID, the health URL.

Node-side (runs on the node with the stdlib only, psutil when present; shipped beside
``uma_guard.py``). The launcher polls its engine's health with :class:`UrlWatch` and the
watchdog reads process start times with :func:`proc_start_time`.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from typing import Any, Dict, Iterable, Optional, Set, Tuple

try:
    import psutil  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the node
    psutil = None

try:
    import ctypes
except ImportError:  # pragma: no cover - minimal Pythons
    ctypes = None  # type: ignore[assignment]

URL_EVERY_S = 1.0


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
