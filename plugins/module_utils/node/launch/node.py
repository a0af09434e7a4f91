# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-side launcher's small parts (uma_launch.py, vllm-uma-launch).

Its log (one line per step on the journal), the node's launch lock (an ``flock`` on a
file, its holder written beside it), the model's files and their eviction from the page
cache, the guard's oom_score_adj, the engine child's set-up (parent-death signal, uid
change's working directory), the exit code of a process and the record's time stamp (the
memory admission is ``node/launch/admission.py``).
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
from typing import Any, Callable, Dict, List, Optional

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
