# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The two-node engine of the lab (tp2: rank 0 on ai1, rank 1 headless on ai2, real vLLM CPU
TP=2): time to healthy through the launchers (systemd units, rank link, lock, guard) vs the same
two ranks started bare, and the time to stop the whole engine from one rank.

    sudo .venv/bin/python benchmarks/two_node.py [--repeat 3]

Needs the lab up (bash lab/up.sh). Runs are interleaved (bare, launcher, bare, ...), caches are
dropped and memory pre-touched before each, medians and minima printed. The bare ranks run the
exact argv and environment of each node's engine config (/etc/uma-vllm/engines/tp2.json); a bare
stop is SIGTERM to rank 0's process: rank 1 is then watched for 30 s (vLLM's headless rank does
not notice) and killed. At the end the engine runs again under systemd as site.yml left it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _lab import docker, drop_caches, pretouch

NODES = ["ai1", "ai2"]
UNIT = "uma-vllm@tp2.service"
PROCS = "vllm-serve-lab|VLLM::"


def node_config(node: str) -> dict:
    return json.loads(docker("exec", node, "cat", "/etc/uma-vllm/engines/tp2.json"))


def node_ip(node: str) -> str:
    return docker("exec", node, "hostname", "-I").split()[0]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except Exception:
        return False


def vllm_count(node: str) -> int:
    out = docker("exec", node, "pgrep", "-fc", PROCS, check=False).strip()
    return int(out or 0)


def wait_healthy(url: str, started: float, timeout: float = 600.0) -> float:
    while time.monotonic() - started < timeout:
        if healthy(url):
            return time.monotonic() - started
        time.sleep(0.25)
    raise SystemExit("no 200 from %s within %.0fs" % (url, timeout))


def wait_gone(started: float, timeout: float, nodes=tuple(NODES)) -> float:
    """Seconds until no vLLM process runs on ``nodes``; None at the timeout."""
    while time.monotonic() - started < timeout:
        if all(vllm_count(n) == 0 for n in nodes):
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def start_units() -> None:
    """Start both ranks' units, rank 0 first. Each start counts toward the unit's start limit
    (StartLimitBurst, the crash-loop brake): a benchmark's deliberate starts clear it first."""
    for node in NODES:
        docker("exec", node, "systemctl", "reset-failed", UNIT, check=False)
        docker("exec", node, "systemctl", "start", UNIT)


def stop_units() -> None:
    for node in NODES:
        docker("exec", node, "systemctl", "stop", UNIT)
    if wait_gone(time.monotonic(), 120) is None:
        raise SystemExit("the engine's processes did not end within 120 s")


def cold() -> None:
    drop_caches()
    pretouch(4 << 30)


def run_bare(configs: dict, url: str) -> dict:
    cold()
    started = time.monotonic()
    for node in NODES:  # rank 0 first, as the role starts them
        config = configs[node]
        env = [arg for key, value in sorted(config["env"].items()) for arg in ("-e", "%s=%s" % (key, value))]
        line = "exec %s >/tmp/bare-rank.log 2>&1" % shlex.join(config["command"])
        docker("exec", "-d", *env, node, "/bin/sh", "-c", line)
    to_healthy = wait_healthy(url, started)
    stop_started = time.monotonic()
    docker("exec", NODES[0], "pkill", "-TERM", "-f", "vllm-serve-lab")
    rank0 = wait_gone(stop_started, 60, [NODES[0]])
    rank1 = wait_gone(stop_started, 30, [NODES[1]])
    if rank1 is None:  # the orphan: stop it for the next run
        docker("exec", NODES[1], "pkill", "-KILL", "-f", PROCS, check=False)
        wait_gone(time.monotonic(), 60)
    return {"mode": "bare", "to_healthy_s": to_healthy, "rank0_gone_s": rank0, "rank1_gone_s": rank1}


def run_launcher(url: str) -> dict:
    cold()
    started = time.monotonic()
    start_units()
    to_healthy = wait_healthy(url, started)
    stop_started = time.monotonic()
    docker("exec", NODES[0], "systemctl", "stop", UNIT)  # returns when rank 0's unit has stopped
    rank0 = time.monotonic() - stop_started
    rank1 = wait_gone(stop_started, 60)
    return {"mode": "launcher", "to_healthy_s": to_healthy, "rank0_gone_s": rank0, "rank1_gone_s": rank1}


def fmt(value) -> str:
    return "%.1f" % value if isinstance(value, float) else "still running at 30 s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (drop_caches)")
    configs = {node: node_config(node) for node in NODES}
    url = "http://%s:%d/health" % (
        node_ip(NODES[0]),
        int(configs[NODES[0]]["command"][configs[NODES[0]]["command"].index("--port") + 1]),
    )
    print(
        "machine: %s, %d CPUs, kernel %s"
        % (platform.processor() or platform.machine(), os.cpu_count(), platform.release())
    )
    print("engine: %s" % shlex.join(configs[NODES[0]]["command"]))
    stop_units()
    rows = []
    try:
        for i in range(args.repeat):
            for mode in ("bare", "launcher"):
                row = run_bare(configs, url) if mode == "bare" else run_launcher(url)
                row["run"] = i + 1
                rows.append(row)
                print("run %d %-8s healthy %6.1f s | stop from rank 0: rank 0 gone %s s, rank 1 gone %s" % (
                    row["run"], mode, row["to_healthy_s"], fmt(row["rank0_gone_s"]), fmt(row["rank1_gone_s"])),
                    flush=True)  # fmt: skip
    finally:
        for node in NODES:
            docker("exec", node, "pkill", "-KILL", "-f", PROCS, check=False)
        start_units()
    print("\n| mode | time to healthy, median (min) | rank 1 gone after a stop of rank 0, median |")
    print("| --- | --- | --- |")
    for mode in ("bare", "launcher"):
        mine = [r for r in rows if r["mode"] == mode]
        times = [r["to_healthy_s"] for r in mine]
        gone = [r["rank1_gone_s"] for r in mine]
        gone_text = "%.1f s" % statistics.median(gone) if all(g is not None for g in gone) else (
            "not within 30 s in %d of %d runs" % (sum(g is None for g in gone), len(gone)))  # fmt: skip
        print("| %s | %.1f s (%.1f s) | %s |" % (mode, statistics.median(times), min(times), gone_text))
    bare = statistics.median(r["to_healthy_s"] for r in rows if r["mode"] == "bare")
    launcher = statistics.median(r["to_healthy_s"] for r in rows if r["mode"] == "launcher")
    print("launcher / bare (medians): %.2fx" % (launcher / bare))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
