# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Detection and recovery times of the lab's two-node engine (tp2: rank 0 on ai1 with the API,
rank 1 headless on ai2; real vLLM CPU, TP=2) per fault, with the engine watchdog
(uma-vllm-watchdog@tp2 on both nodes, as site.yml installs it) and without it (both watchdogs
stopped: plain systemd Restart=on-failure plus the launchers' rank link).

    sudo .venv/bin/python benchmarks/watchdog_faults.py [--repeat 3] [--nodes ai1 ai2] [--cap 150]

Needs the lab up (bash lab/up.sh; or --nodes cluster-ai1 cluster-ai2 inside molecule/cluster).
Faults, interleaved per repeat (watchdog, plain, watchdog, plain ...):

  wedge        SIGSTOP of VLLM::EngineCore on rank 0 (rank 0's /health keeps answering 200)
  kill-worker  SIGKILL of VLLM::Worker_TP1 on rank 1, the engine healthy before

detected  = the first moment rank 0's engine unit is no longer active (someone acted on the
            fault: the watchdog's stop, or the rank link's exit 69), from the fault;
recovered = the first answered 1-token completion through rank 0 after that, from the fault.
A run that does not recover within --cap seconds is printed as "not within CAP s" and then
healed by hand (SIGCONT, or a restart of both ranks) so the next run starts healthy.
Medians over the runs that recovered; the count of those that did not is printed beside them.
Nothing here asserts: it prints measurements.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

from _lab import LAB_PORT as PORT
from _lab import lab_completion_ok

UNIT = "uma-vllm@tp2.service"
WATCHDOG = "uma-vllm-watchdog@tp2.service"


def sh(*argv: str, check: bool = True, timeout: float = 60) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(argv), proc.stderr.strip() or proc.stdout.strip()))
    return proc.stdout


def dexec(node: str, *argv: str, check: bool = True, timeout: float = 60) -> str:
    return sh("docker", "exec", node, *argv, check=check, timeout=timeout)


def active(node: str) -> str:
    return dexec(node, "systemctl", "show", "-p", "ActiveState", "--value", UNIT, check=False).strip()


def completion(node: str) -> bool:
    return lab_completion_ok(node, max_tokens=1, curl_timeout_s=10, exec_timeout_s=20)


def wait_serving(node: str, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if completion(node):
            return True
        time.sleep(1)
    return False


def set_watchdog(nodes: List[str], on: bool) -> None:
    for node in nodes:
        # a restarted watchdog starts a fresh restart window: each run is measured alone
        dexec(node, "systemctl", "restart" if on else "stop", WATCHDOG)


def heal(nodes: List[str]) -> None:
    """Bring the engine back by hand after a run that did not recover by itself."""
    for node in nodes:
        dexec(node, "pkill", "-CONT", "-f", "^VLLM::", check=False)
    for node in nodes:
        dexec(node, "systemctl", "stop", UNIT, check=False, timeout=200)
    for node in nodes:
        dexec(node, "systemctl", "reset-failed", UNIT, check=False)
        dexec(node, "systemctl", "start", "--no-block", UNIT, check=False)
    wait_serving(nodes[0], 600)


def inject(fault: str, nodes: List[str]) -> None:
    if fault == "wedge":
        dexec(nodes[0], "pkill", "-STOP", "-f", "^VLLM::EngineCore")
    else:
        dexec(nodes[1], "pkill", "-KILL", "-f", "^VLLM::Worker_TP1")


def one_run(fault: str, mode: str, nodes: List[str], cap: float) -> Dict[str, Optional[float]]:
    set_watchdog(nodes, mode == "watchdog")
    if not wait_serving(nodes[0], 600):
        raise RuntimeError("the engine does not serve before the run")
    time.sleep(12 if mode == "watchdog" else 2)  # the watchdog's first healthy ticks
    t0 = time.monotonic()
    inject(fault, nodes)
    detected = recovered = None
    health_200_after = dexec(nodes[0], "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "3",
                             "http://127.0.0.1:%d/health" % PORT, check=False).strip()  # fmt: skip
    while time.monotonic() - t0 < cap:
        if detected is None and active(nodes[0]) != "active":
            detected = time.monotonic() - t0
        if detected is not None and completion(nodes[0]):
            recovered = time.monotonic() - t0
            break
        time.sleep(0.5)
    if recovered is None:
        heal(nodes)
    return {"detected": detected, "recovered": recovered, "health_after": health_200_after}


def fmt(values: List[Optional[float]], cap: float) -> str:
    got = [v for v in values if v is not None]
    missed = len(values) - len(got)
    if not got:
        return "not within %.0f s (%d of %d)" % (cap, missed, len(values))
    text = "%.1f s" % statistics.median(got)
    if missed:
        text += " (%d of %d not within %.0f s)" % (missed, len(values), cap)
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--nodes", nargs=2, default=["ai1", "ai2"])
    p.add_argument("--cap", type=float, default=150.0, help="seconds a run may take to recover")
    p.add_argument("--faults", nargs="+", default=["wedge", "kill-worker"])
    args = p.parse_args()
    results: Dict[str, Dict[str, List[Dict[str, Optional[float]]]]] = {}
    started = time.strftime("%H:%M", time.gmtime())
    for i in range(args.repeat):
        for fault in args.faults:
            for mode in ("watchdog", "plain"):
                run = one_run(fault, mode, args.nodes, args.cap)
                results.setdefault(fault, {}).setdefault(mode, []).append(run)
                print("run %d %-11s %-8s detected %s recovered %s (/health right after the fault: %s)" % (
                    i + 1, fault, mode, run["detected"] and round(run["detected"], 1),
                    run["recovered"] and round(run["recovered"], 1), run["health_after"]), flush=True)  # fmt: skip
    set_watchdog(args.nodes, True)
    print()
    print("%s, kernel %s, %s-%s UTC, %d runs per cell, interleaved" % (
        platform.node(), platform.release(), started, time.strftime("%H:%M", time.gmtime()), args.repeat))  # fmt: skip
    print()
    print("| fault | mode | detected, median | recovered (completion answered), median |")
    print("| --- | --- | --- | --- |")
    names = {"watchdog": "watchdog + rank link + Restart=", "plain": "rank link + Restart= (no watchdog)"}
    for fault, modes in results.items():
        for mode, runs in modes.items():
            print("| %s | %s | %s | %s |" % (
                fault, names[mode], fmt([r["detected"] for r in runs], args.cap),
                fmt([r["recovered"] for r in runs], args.cap)))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
