# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard's status and samples files, written off the tick loop.

Node-side (runs on the node with the stdlib only; shipped beside ``uma_guard.py``).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
from typing import Any, Dict, List, Optional

from ..base.common import node_write, node_write_json, open_safe_dir


def cpu_usage() -> Dict[str, Any]:
    """Where the guard's CPU went, from one reading: the total, user and system seconds, and its page
    faults (a major fault is a page read back from disk: the guard's own code or data evicted under
    memory pressure)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
        "cpu_user_s": round(usage.ru_utime, 3),
        "cpu_sys_s": round(usage.ru_stime, 3),
        "major_faults": int(usage.ru_majflt),
        "minor_faults": int(usage.ru_minflt),
    }


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def open_samples(path: str) -> Any:
    """The samples file, opened so that a root guard cannot be turned against another file.

    The directory must be checked safe (``_common.open_safe_dir``: a real directory of root or
    the guard's user, writable by nobody else; no /tmp), and the file itself is opened with
    O_NOFOLLOW in it: a symlink planted there is refused.
    """
    dfd = open_safe_dir(os.path.dirname(os.path.abspath(path)))
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(os.path.basename(path), flags, 0o640, dir_fd=dfd)
    finally:
        os.close(dfd)
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
            return write_status(self.status_file, data)

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


def write_status(path: Optional[str], data: Dict[str, Any]) -> bool:
    """The final status: atomic and durable (fsync). Running updates go through Writer."""
    if not path:
        return True
    try:
        node_write_json(path, data)
        return True
    except OSError as err:
        sys.stderr.write("uma_guard: cannot write status %s: %s\n" % (path, err))
        return False


def _replace_file(path: str, content: str) -> None:
    """Atomic replace without fsync in a checked directory: readers see the whole old or new file."""
    node_write(path, content, 0o644, durable=False)
