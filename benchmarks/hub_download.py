# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_fetch's two Hub clients, side by side: the built-in one (urllib) and huggingface_hub.

Serves a model directory (default the lab's 1 GiB tiny Llama, .cache/lab/models/tiny-1g) with
lab/hub_standin.py on 127.0.0.1 (a STAND-IN FOR THE HUB, with its "CDN" redirects), then
downloads it with ``models.fetch`` (plan + execute: the download, the sha256 of every file,
the manifest) into a fresh directory, each client in turn, ``--runs`` interleaved rounds.
Prints the machine, each run's seconds, and per client the median seconds and MB/s. The page
cache is dropped before each run when this runs as root (the source files are read cold).
Loopback, one machine: it compares the clients' own cost, not a link or the Hub.

  .venv/bin/python benchmarks/hub_download.py [--model DIR] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "lab"))
sys.path.insert(0, os.path.join(ROOT, ".cache", "collections"))

import hub_standin

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf

CLIENTS = ("builtin", "huggingface_hub")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _drop_caches() -> None:
    if os.geteuid() == 0:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as handle:
            handle.write("3\n")


def one(endpoint: str, client: str, work: str) -> float:
    dest = os.path.join(work, "dest-" + client)
    shutil.rmtree(dest, ignore_errors=True)
    request = mf.validate({"repo_id": "bench/model", "revision": "main", "dest": dest, "endpoint": endpoint,
                           "allow_patterns": None, "verify": False, "token_file": None, "client": client})  # fmt: skip
    _drop_caches()
    start = time.monotonic()
    made = mf.make_client(request)
    mf.execute(mf.plan(request, made), made)
    took = time.monotonic() - start
    shutil.rmtree(dest, ignore_errors=True)
    return took


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(ROOT, ".cache", "lab", "models", "tiny-1g"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    size = sum(os.path.getsize(os.path.join(args.model, n)) for n in os.listdir(args.model)
               if os.path.isfile(os.path.join(args.model, n)) and not n.startswith("."))  # fmt: skip
    os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="uma-bench-hf-"))
    server = hub_standin.serve({"bench/model": args.model}, cdn=True)
    times = {client: [] for client in CLIENTS}
    work = tempfile.mkdtemp(prefix="uma-bench-hub-", dir=os.path.dirname(os.path.abspath(args.model)))
    print("machine: %s, %d CPUs, Python %s; model %s, %d bytes; stand-in Hub on %s (--cdn)"
          % (_cpu(), os.cpu_count() or 0, platform.python_version(), args.model, size, server.endpoint))  # fmt: skip
    try:
        for run in range(args.runs):
            order = CLIENTS if run % 2 == 0 else tuple(reversed(CLIENTS))
            for client in order:
                took = one(server.endpoint, client, work)
                times[client].append(took)
                print("run %d %-16s %.2f s" % (run + 1, client, took))
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(work, ignore_errors=True)
    print("%-16s %10s %10s  (download + sha256 of every file + manifest)" % ("client", "median s", "MB/s"))
    for client in CLIENTS:
        median = statistics.median(times[client])
        print("%-16s %10.2f %10.1f" % (client, median, size / median / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
