# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A bounded shard prefetch beside a loader (an experiment of issue 20 item 5; not part of the collection).

vLLM's ``--safetensors-load-strategy prefetch`` reads the whole checkpoint into the page cache ahead of the
load, which on a unified-memory node is the problem itself. This reads at most ``--ahead`` shards ahead of
the one the loader has mapped, and evicts each shard once the loader has unmapped it, so the page cache holds
the mapped shard and the next one(s), not the checkpoint:

- every ``--interval`` it reads ``/proc/PID/maps`` of the loader (``--pid``): which shards (the
  ``.safetensors`` files under ``--paths``, in name order, the order vLLM and the stand-in load them) are
  mapped now;
- when shard k is mapped for the first time, shards k+1 .. k+ahead get ``posix_fadvise(WILLNEED)`` (the
  kernel's readahead over the whole file, issued from a thread: it can block while the disk's queue is
  full); with ``--first`` shard 0 too, at the start;
- a shard that was mapped and no longer is gets ``posix_fadvise(DONTNEED)`` (the consumed one; pages
  still mapped by someone stay);
- it stops when the loader exits, when every shard was mapped and unmapped, or on SIGTERM, and prints one
  JSON line:
  what it prefetched and evicted, when, and its own CPU time.

stdlib only (it is copied into the VM guest by benchmarks/uma_vm.py as it is).

    python3 benchmarks/shard_prefetch.py --pid PID --paths MODEL_DIR [--ahead 1] [--first] [--interval 0.02]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Dict, List, Optional, Set


def shard_files(paths: List[str]) -> List[str]:
    """The .safetensors files under the paths (files or directories, recursive), real paths, in name order."""
    found: Set[str] = set()
    for path in paths:
        if os.path.isfile(path):
            found.add(os.path.realpath(path))
            continue
        for top, _dirs, names in os.walk(path):
            found.update(os.path.realpath(os.path.join(top, n)) for n in names if n.endswith(".safetensors"))
    return sorted(found, key=lambda p: (os.path.basename(p), p))


def mapped_files(maps_text: str, wanted: Set[str]) -> Set[str]:
    """Which of ``wanted`` appear in a /proc/PID/maps text (the path is the 6th field; ' (deleted)' dropped)."""
    out: Set[str] = set()
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            if path in wanted:
                out.add(path)
    return out


def fadvise(path: str, advice: int) -> Optional[str]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        return str(err)
    try:
        os.posix_fadvise(fd, 0, 0, advice)
    except OSError as err:
        return str(err)
    finally:
        os.close(fd)
    return None


class Prefetcher:
    """The decisions, from successive sets of mapped shards (pure; the actions are callbacks)."""

    def __init__(self, files: List[str], ahead: int, prefetch, evict) -> None:
        self.files, self.ahead = files, ahead
        self.index: Dict[str, int] = {p: i for i, p in enumerate(files)}
        self.prefetch, self.evict = prefetch, evict
        self.prefetched: Set[int] = set()
        self.seen: Set[str] = set()
        self.evicted: Set[str] = set()

    def start(self, first: bool) -> None:
        if first and self.files and self.ahead > 0:
            self._ask(0)

    def _ask(self, i: int) -> None:
        if 0 <= i < len(self.files) and i not in self.prefetched:
            self.prefetched.add(i)
            self.prefetch(self.files[i])

    def tick(self, mapped: Set[str]) -> None:
        for path in sorted(mapped - self.seen, key=self.index.__getitem__):
            self.seen.add(path)
            k = self.index[path]
            # the loader goes in name order: a shard before this one that no tick saw mapped (mapped and
            # unmapped between two reads) was consumed too, and is evicted below
            self.seen.update(self.files[:k])
            self.prefetched.update(range(k + 1))  # being read or done: never prefetched after the fact
            for j in range(k + 1, k + 1 + self.ahead):
                self._ask(j)
        for path in sorted(self.seen - mapped - self.evicted, key=self.index.__getitem__):
            self.evicted.add(path)
            self.evict(path)

    def done(self) -> bool:
        return len(self.evicted) == len(self.files)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--pid", type=int, required=True, help="the loader's process")
    p.add_argument("--paths", nargs="+", required=True, help="the checkpoint's files or directories")
    p.add_argument("--ahead", type=int, default=1, help="shards read ahead of the mapped one (0: evict only)")
    p.add_argument("--first", action="store_true", help="prefetch shard 0 at the start too")
    p.add_argument("--no-evict", action="store_true", help="leave consumed shards in the cache")
    p.add_argument("--interval", type=float, default=0.02, help="seconds between /proc/PID/maps reads")
    p.add_argument("--max-duration", type=float, default=3600.0)
    args = p.parse_args(argv)
    if args.ahead < 0 or args.interval <= 0:
        p.error("--ahead must be >= 0 and --interval > 0")
    files = shard_files(args.paths)
    if not files:
        p.error("no .safetensors files under %s" % " ".join(args.paths))
    t0 = time.monotonic()
    events: List[Dict[str, object]] = []
    lock = threading.Lock()
    threads: List[threading.Thread] = []

    def note(what: str, path: str, **extra: object) -> None:
        with lock:
            events.append(dict(t=round(time.monotonic() - t0, 3), what=what, shard=os.path.basename(path), **extra))

    def prefetch(path: str) -> None:
        def work() -> None:
            start = time.monotonic()
            err = fadvise(path, os.POSIX_FADV_WILLNEED)
            note("prefetched", path, s=round(time.monotonic() - start, 3), error=err)

        note("prefetch", path)
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        threads.append(thread)

    def evict(path: str) -> None:
        if args.no_evict:
            note("consumed", path)
            return
        note("evict", path, error=fadvise(path, os.POSIX_FADV_DONTNEED))

    pf = Prefetcher(files, args.ahead, prefetch, evict)
    pf.start(args.first)
    maps = "/proc/%d/maps" % args.pid
    wanted = set(files)
    stop = "max-duration"
    signalled = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: signalled.set())
    while time.monotonic() - t0 < args.max_duration:
        if signalled.is_set():
            stop = "signal"
            break
        try:
            with open(maps, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            stop = "loader exited"
            break
        pf.tick(mapped_files(text, wanted))
        if pf.done():
            stop = "every shard consumed"
            break
        time.sleep(args.interval)
    for thread in threads:
        thread.join(timeout=60)
    cpu = os.times()
    print(json.dumps({"shards": len(files), "ahead": args.ahead, "stop": stop, "cpu_s": round(cpu.user + cpu.system, 3),
                      "events": events}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
