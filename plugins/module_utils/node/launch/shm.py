# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine's POSIX shared-memory segments, removed when the engine is gone.

vLLM's processes talk through POSIX shared memory: its message queues are Python
``SharedMemory`` segments (``/dev/shm/psm_<hex>``) and its multiprocessing locks named
semaphores (``/dev/shm/sem.mp-<name>``). An engine that stops unclean - SIGKILL, a worker killed by
the OOM killer, the launcher's own kill of a rank whose peer is gone, and here even a SIGTERM to a
container run with ``--ipc host`` - leaves them in the node's tmpfs: about 400 MiB of apparent size
per stop with the lab's CPU engine (vLLM issue #51579 reports the same of its offload region). On a
unified-memory node tmpfs pages are the memory the next start's KV cache wants. Python's resource
tracker unlinks the segments their creators registered once the engine's processes are all gone,
unless it was killed with them (a container's stop, a cgroup kill): natively, the sweep races it
and either may remove a segment; the other finds it gone.

What is removed, and only that: a file directly in ``shm_dir`` with one of those two name forms,
created after this launch started the engine, that one of the engine's own processes (its process
tree; for a container, the tree below the container's init) had mapped when the launcher looked,
still the same file (inode) - and only once every one of those processes is gone. ``/dev/shm`` is
the node's, shared with every workload: a segment of anything else, or one still in use, is never
touched. The launcher looks at the engine's maps while it loads (every TRACK_EVERY_S), at health and
before it stops the engine; what it found is kept in ``<state_dir>/launches/<engine>/shm/segments.json`` so a
launcher that was itself killed (systemd's stop timeout) leaves the sweep to the next start.
Stdlib only (a node program's part).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ..base import paths as _paths
from ..base.common import node_write_json, read_state
from ..cluster import ranks as _ranks

SHM_DIR = "/dev/shm"
# Python's SharedMemory default name (psm_ + token_hex), multiprocessing's named semaphores
# (sem_open("/mp-XXXXXXXX") is the file sem.mp-XXXXXXXX)
NAME_RE = re.compile(r"^(psm_[0-9a-f]{1,64}|sem\.mp-[A-Za-z0-9_]{1,64})$")
TRACK_EVERY_S = 5.0
CREATED_SLACK_S = 2.0  # a file's ctime may be this much before the engine's start (clock granularity)
RECORD = os.path.join("shm", "segments.json")  # beside the launch records, not one (no launch.json)
MAX_TRACKED = 4096
# Reads the maps of the given pids as the engine's user (a root launcher without CAP_SYS_PTRACE, the
# unit's capability set, may not read another user's /proc/<pid>/maps); prints "pid dev ino" lines.
_MAPS_AS_USER = (
    "import sys\n"
    "for pid in sys.argv[1:]:\n"
    "    try:\n"
    "        lines = open('/proc/%s/maps' % pid, 'rb').read().decode('ascii', 'replace').splitlines()\n"
    "    except OSError:\n"
    "        continue\n"
    "    for line in lines:\n"
    "        parts = line.split(None, 5)\n"
    "        if len(parts) == 6 and parts[4] != '0':\n"
    "            print(pid, parts[3], parts[4])\n"
)


def _started(fields: Optional[Tuple[str, List[str]]]) -> Optional[Tuple[int, int]]:
    """(ppid, start time in clock ticks) from a proc_stat, None for a zombie (it maps nothing any more)."""
    # after the comm: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice threads itrealvalue starttime
    if fields is None:
        return None
    values = fields[1]
    if len(values) < 20 or not values[19].isdigit() or values[0] in ("Z", "X"):
        return None
    return int(values[1]), int(values[19])


def _stat_fields(proc_root: str, pid: int) -> Optional[Tuple[int, int]]:
    """(ppid, start time) of a process, None when it is gone or a zombie."""
    return _started(_ranks.proc_stat(proc_root, pid))


def process_tree(roots: Iterable[int], proc_root: str = "/proc") -> Dict[int, int]:
    """{pid: start time} of the given processes and all their descendants that exist now."""
    children: Dict[int, List[int]] = {}
    starts: Dict[int, int] = {}
    for pid, fields in _ranks.process_table(proc_root).items():
        found = _started(fields)
        if found is not None:
            starts[pid] = found[1]
            children.setdefault(found[0], []).append(pid)
    out: Dict[int, int] = {}
    todo = [pid for pid in roots if pid in starts]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out[pid] = starts[pid]
        todo.extend(children.get(pid, []))
    return out


def _parse_dev(text: str) -> Optional[int]:
    major, sep, minor = text.partition(":")
    try:
        return os.makedev(int(major, 16), int(minor, 16)) if sep else None
    except ValueError:
        return None


def parse_maps(lines: Iterable[str]) -> Set[Tuple[int, int]]:
    """(device, inode) of every file a process has mapped (``/proc/<pid>/maps`` lines)."""
    out = set()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 5 or parts[4] == "0" or not parts[4].isdigit():
            continue
        dev = _parse_dev(parts[3])
        if dev is not None:
            out.add((dev, int(parts[4])))
    return out


def mapped_files(
    pids: Iterable[int],
    proc_root: str = "/proc",
    identity: Optional[Dict[str, Any]] = None,
    runner: Callable[..., Any] = subprocess.run,
    python: str = _paths.PYTHON,
) -> Tuple[Dict[int, Set[Tuple[int, int]]], List[int]]:
    """{pid: (device, inode) of the files it maps}, and the pids whose maps could not be read.

    Read directly; a process whose maps this launcher may not read (another user's, without
    CAP_SYS_PTRACE) is read again by a child running as the engine's user (``identity``)."""
    found: Dict[int, Set[Tuple[int, int]]] = {}
    denied: List[int] = []
    for pid in pids:
        try:
            with open(os.path.join(proc_root, str(pid), "maps"), "rb") as handle:
                found[pid] = parse_maps(handle.read().decode("ascii", "replace").splitlines())
        except PermissionError:
            denied.append(pid)
        except OSError:  # gone
            continue
    if denied and identity and proc_root == "/proc":
        try:
            done = runner(
                [python, "-S", "-c", _MAPS_AS_USER, *[str(pid) for pid in denied]],
                user=identity["uid"], group=identity["gid"], extra_groups=[],
                stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return found, denied
        if done.returncode == 0:
            for line in done.stdout.decode("ascii", "replace").splitlines():
                pid_text, _sep, rest = line.partition(" ")
                if pid_text.isdigit():
                    found.setdefault(int(pid_text), set()).update(parse_maps(["x x x " + rest]))
            denied = []
    return found, denied


def _check_record(value: Any) -> Optional[str]:
    """The shape of shm/segments.json: {"dir": str, "since": number, "pids": [[pid, start], ...],
    "segments": {name: inode}}."""
    if not isinstance(value.get("dir"), str) or not os.path.isabs(value["dir"]):
        return "has no absolute 'dir'"
    since = value.get("since")
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not 0 <= since < 1e11:
        return "has no 'since' time"
    pids = value.get("pids")
    if not isinstance(pids, list) or len(pids) > MAX_TRACKED or not all(
        isinstance(item, list) and len(item) == 2
        and all(isinstance(part, int) and not isinstance(part, bool) and part >= 0 for part in item)
        for item in pids
    ):  # fmt: skip
        return "has no list of [pid, start time] pairs under 'pids'"
    segments = value.get("segments")
    if not isinstance(segments, dict) or len(segments) > MAX_TRACKED or not all(
        isinstance(name, str) and NAME_RE.match(name) and isinstance(ino, int) and not isinstance(ino, bool)
        for name, ino in segments.items()
    ):  # fmt: skip
        return "has no mapping of segment names to inodes under 'segments'"
    return None


class Segments:
    """The engine's shared-memory segments: found while it runs, removed when it is gone."""

    def __init__(
        self, record_path: str, shm_dir: str = SHM_DIR, proc_root: str = "/proc",
        identity: Optional[Dict[str, Any]] = None, python: str = _paths.PYTHON,
        line: Callable[[str], None] = lambda _text: None,
    ) -> None:  # fmt: skip
        self.record_path = record_path
        self.shm_dir = shm_dir
        self.proc_root = proc_root
        self.identity = identity
        self.python = python
        self.line = line
        self.since: Optional[float] = None
        self.pids: Dict[int, int] = {}
        self.segments: Dict[str, int] = {}
        self.last_look = 0.0  # monotonic time of the launcher's last look (Launch.track_shm keeps the pace)
        self.denied_said = False
        self.seen: List[str] = []  # every name tracked in this launch, in order (the launch record's)
        self.lock = threading.Lock()  # a look runs in its own thread (Launch.track_shm); the sweep in the launcher's

    def started(self) -> None:
        """The engine is about to start: files older than now are not its."""
        self.since = time.time()
        self.pids, self.segments, self.last_look, self.seen = {}, {}, 0.0, []

    def _candidates(self) -> Dict[Tuple[int, int], str]:
        """{(device, inode): name} of the regular files of the two name forms made since the start."""
        out = {}
        try:
            names = os.listdir(self.shm_dir)
        except OSError:
            return {}
        floor = (self.since or 0) - CREATED_SLACK_S
        for name in names:
            if not NAME_RE.match(name):
                continue
            try:
                info = os.lstat(os.path.join(self.shm_dir, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_ctime >= floor:
                out[(info.st_dev, info.st_ino)] = name
        return out

    def look(self, roots: Iterable[int]) -> int:
        """Note the segments the engine's processes (``roots`` and below) map now; returns how many
        were new (when to look is the launcher's: Launch.track_shm)."""
        if self.since is None:
            return 0
        candidates = self._candidates()
        if not candidates:
            return 0
        tree = process_tree([pid for pid in roots if pid], self.proc_root)
        if not tree:
            return 0
        maps, denied = mapped_files(tree, self.proc_root, self.identity, python=self.python)
        if denied and not self.denied_said:
            self.denied_said = True
            self.line(
                "cannot read the memory maps of the engine's processes %s: their shared-memory segments are not"
                " tracked (nothing of /dev/shm is removed for them)" % ", ".join(str(pid) for pid in denied[:5])
            )
        new = 0
        with self.lock:
            for pid, mapped in maps.items():
                mine = [key for key in mapped if key in candidates]
                if mine and len(self.pids) < MAX_TRACKED:
                    self.pids[pid] = tree[pid]  # a process that maps one: the sweep waits until it is gone
                for key in mine:
                    name = candidates[key]
                    if self.segments.get(name) != key[1] and len(self.segments) < MAX_TRACKED:
                        self.segments[name] = key[1]
                        if name not in self.seen:
                            self.seen.append(name)
                        new += 1
            if new:
                self._save()
        return new

    def _save(self) -> None:
        if not self.segments:
            return
        try:
            node_write_json(
                self.record_path,
                {"dir": self.shm_dir, "since": round(self.since or 0, 3),
                 "pids": sorted([pid, start] for pid, start in self.pids.items())[:MAX_TRACKED],
                 "segments": dict(sorted(self.segments.items()))},
            )  # fmt: skip
        except OSError as err:
            self.line("cannot write %s: %s" % (self.record_path, err))

    def load_left(self) -> bool:
        """A previous launch's record (a launcher killed before its sweep): taken as this one's."""
        value = read_state(self.record_path, dict, _check_record, prog="vllm-uma-launch")
        if value is None:
            return False
        if os.path.realpath(value["dir"]) != os.path.realpath(self.shm_dir):
            self.line("%s names %s, not %s: set aside" % (self.record_path, value["dir"], self.shm_dir))
            self._forget()
            return False
        self.since = float(value["since"])
        self.pids = dict(value["pids"])
        self.segments = dict(value["segments"])
        return True

    def _forget(self) -> None:
        try:
            os.unlink(self.record_path)
        except FileNotFoundError:
            pass
        except OSError as err:
            self.line("cannot remove %s: %s" % (self.record_path, err))

    def running(self) -> List[int]:
        """The processes seen mapping a tracked segment that still run (the same pid, the same start time)."""
        with self.lock:
            pids = list(self.pids.items())
        return sorted(pid for pid, start in pids if (_stat_fields(self.proc_root, pid) or (0, -1))[1] == start)

    def sweep(self, wait_s: float = 0.0) -> Dict[str, Any]:
        """Remove the tracked segments once every tracked process is gone (waiting up to ``wait_s``
        for the last ones to exit). Returns what was done: {"removed": [...], "bytes": N,
        "kept": {name: why}, "running": [pids]} (running: nothing was removed, the record stays)."""
        done: Dict[str, Any] = {"removed": [], "bytes": 0, "kept": {}, "running": []}
        if not self.segments:
            self._forget()
            return done
        end = time.monotonic() + wait_s
        running = self.running()
        while running and time.monotonic() < end:
            time.sleep(0.1)
            running = self.running()
        if running:
            done["running"] = running
            return done  # the record stays: the next start (or stop) sweeps
        with self.lock:
            try:
                dir_fd = os.open(self.shm_dir, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as err:
                done["kept"] = {name: "cannot open %s: %s" % (self.shm_dir, err.strerror) for name in self.segments}
                return done
            try:
                floor = (self.since or 0) - CREATED_SLACK_S
                for name, ino in sorted(self.segments.items()):
                    try:
                        info = os.lstat(name, dir_fd=dir_fd)
                    except FileNotFoundError:
                        continue  # vLLM removed it itself
                    except OSError as err:
                        done["kept"][name] = err.strerror
                        continue
                    if info.st_ino != ino or not stat.S_ISREG(info.st_mode) or info.st_ctime < floor:
                        done["kept"][name] = "another file now"
                        continue
                    try:
                        os.unlink(name, dir_fd=dir_fd)
                    except OSError as err:
                        done["kept"][name] = err.strerror
                        continue
                    done["removed"].append(name)
                    done["bytes"] += info.st_blocks * 512
            finally:
                os.close(dir_fd)
            self.segments = {}
            self.pids = {}
            self._forget()
        return done
