# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The README's fault table: each fault on the two-node engine tp2 (real vLLM CPU, TP=2, rank 0 with
the API, rank 1 headless), detected and recovered, for the container runtime and the native runtime
side by side: two labs up at once, the faults interleaved (round 1: container then native per fault,
round 2: native then container, ...), the medians over the rounds.

    .venv/bin/python benchmarks/fault_table.py [--repeat 3] [--json FILE]
        [--container cluster-ctr-ai1 cluster-ctr-ai2] [--native cluster-ai1 cluster-ai2]
        [--faults NAME ...] [--timeout 900]

Needs both labs converged and serving (the nodes of molecule/cluster_container and molecule/cluster):

    molecule converge -s cluster_container && molecule converge -s cluster
    .venv/bin/python benchmarks/fault_table.py --repeat 3 --json faults.json
    molecule cleanup -s cluster_container    # the machine's own vm.* values back (this lab changed them first)
    docker rm -f cluster-ai1 cluster-ai2 cluster-ctr-ai1 cluster-ctr-ai2
    molecule reset -s cluster && molecule reset -s cluster_container

Both labs' first nodes set the same vm.* values on the one kernel; only the lab converged first
recorded the machine's own values, so molecule/cluster's cleanup (and `molecule destroy`, which runs
the cleanup again) fails there, finding no record: remove its nodes with docker instead.

Each fault is one of molecule/cluster's drill scripts (engine.sh, watchdog.sh: the same code the
Molecule scenarios run, pointed at the lab's nodes by UMA_CLUSTER_NODES and UMA_CLUSTER_RUNTIME),
which prints one line per fault that healed:

    UMA-DRILL fault=NAME runtime=RUNTIME detected_s=S recovered_s=S

detected: rank 0's /health stopped answering (engine.sh), or the watchdog's restart decision from its
events (watchdog.sh's SIGSTOP wedges); recovered: /health and a 2-token completion answer again through
rank 0 and every rank runs a new systemd invocation (the whole engine restarted), from the fault. Before
each fault both watchdogs are restarted (a fresh restart window: the lab's faults follow each other
within minutes, the budget is 3 restarts an hour). A drill that fails is recorded with the tail of its
output, the engine is brought back by hand, and the table counts it as not healed. Nothing here asserts:
it prints measurements (the Molecule scenarios assert).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

from _lab import lab_completion_ok

HERE = os.path.dirname(os.path.abspath(__file__))
DRILLS = os.path.join(os.path.dirname(HERE), "molecule", "cluster")
UNIT = "uma-vllm@tp2.service"
LINE = re.compile(r"^UMA-DRILL fault=(\S+) runtime=(\S+) detected_s=(\S+) recovered_s=(\S+)$")

# name -> (script, arguments; "{rank1}" is rank 1's node), runtimes it applies to
FAULTS = {
    "kill-worker-rank1": (("engine.sh", "kill-worker", "1"), ("container", "native")),
    "kill-worker-rank0": (("engine.sh", "kill-worker", "0"), ("container", "native")),
    "sigstop-rank1": (("watchdog.sh", "wedge-rank1"), ("container", "native")),
    "sigstop-rank0": (("watchdog.sh", "wedge"), ("container", "native")),
    "kill-launcher-rank1": (("engine.sh", "kill-launcher", "1"), ("container", "native")),
    "restart-docker-rank0": (("engine.sh", "restart-docker", "0"), ("container",)),
    "restart-docker-rank1": (("engine.sh", "restart-docker", "1"), ("container",)),
    "reboot-rank1": (("engine.sh", "reboot", "1"), ("container", "native")),
    "systemctl-stop-rank1": (("engine.sh", "stop", "{rank1}"), ("container", "native")),
}


def sh(argv: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def dexec(node: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return sh(["docker", "exec", node, *argv], timeout=timeout)


def serving(node: str) -> bool:
    return lab_completion_ok(node, max_tokens=2, curl_timeout_s=30, exec_timeout_s=60)


def wait_serving(node: str, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if serving(node):
            return True
        time.sleep(2)
    return False


def start_engine(nodes: List[str]) -> bool:
    """Both ranks started the way an operator would (rank 0 first), then wait until it serves."""
    for node in nodes:
        dexec(node, "systemctl", "reset-failed", UNIT)
        dexec(node, "systemctl", "start", "--no-block", UNIT)
    return wait_serving(nodes[0], 600)


def heal(nodes: List[str]) -> bool:
    """After a drill that failed: every stopped process continued, both ranks stopped and started."""
    for node in nodes:
        dexec(node, "pkill", "-CONT", "-f", "^VLLM::")
    for node in nodes:
        dexec(node, "systemctl", "stop", UNIT, timeout=200)
    return start_engine(nodes)


def drill(fault: str, runtime: str, nodes: List[str], timeout: float) -> Dict[str, object]:
    script, *args = FAULTS[fault][0]
    env = dict(os.environ, UMA_CLUSTER_NODES=" ".join(nodes), UMA_CLUSTER_RUNTIME=runtime)
    run: Dict[str, object] = {"fault": fault, "runtime": runtime, "nodes": nodes,
                              "started_utc": time.strftime("%H:%M:%S", time.gmtime())}  # fmt: skip
    if not wait_serving(nodes[0], 300):
        run["error"] = "the engine did not serve before the fault"
        run["healed_by_hand"] = heal(nodes)
        return run
    fresh = sh(["bash", os.path.join(DRILLS, "watchdog.sh"), "fresh"], env=env, timeout=120)
    argv = ["bash", os.path.join(DRILLS, script)] + [a.format(rank1=nodes[1]) for a in args]
    try:
        proc = sh(argv, env=env, timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = "%s%s" % (exc.stdout or "", exc.stderr or "")
        out, rc = out if isinstance(out, str) else out.decode(errors="replace"), "timeout %.0f s" % timeout
    lines = [m.groups() for m in map(LINE.match, out.splitlines()) if m]
    if rc == 0 and lines and fresh.returncode == 0:
        detected, recovered = lines[-1][2:]
        run.update(detected_s=float(detected), recovered_s=float(recovered))
    else:
        run["error"] = "exit %s: %s" % (rc, " | ".join(out.strip().splitlines()[-6:]))
        if fresh.returncode != 0:
            run["error"] += " (watchdog.sh fresh: %s)" % (fresh.stdout + fresh.stderr).strip()[-300:]
    if "error" in run:  # maybe broken: every process continued, both ranks stopped and started
        run["restarted_by_hand"] = heal(nodes)
    elif fault.startswith("systemctl-stop"):  # stopped on purpose: started again
        run["restarted_by_hand"] = start_engine(nodes)
    return run


def cell(runs: List[Dict[str, object]], key: str) -> str:
    got = [float(r[key]) for r in runs if key in r]  # type: ignore[arg-type]
    failed = len(runs) - len(got)
    if not got:
        return "not healed (%d of %d)" % (failed, len(runs)) if runs else "-"
    text = "%.1f s" % statistics.median(got)
    if len(got) > 1:
        text += " (%.1f-%.1f)" % (min(got), max(got))
    if failed:
        text += ", %d of %d not healed" % (failed, len(runs))
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--container", nargs=2, default=["cluster-ctr-ai1", "cluster-ctr-ai2"], metavar="NODE")
    p.add_argument("--native", nargs=2, default=["cluster-ai1", "cluster-ai2"], metavar="NODE")
    p.add_argument("--faults", nargs="+", default=list(FAULTS), choices=list(FAULTS), metavar="NAME")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one drill may take (default 900)")
    p.add_argument("--json", help="write every run here, after each run")
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat %d: give 1 or more" % args.repeat)
    labs = {"container": args.container, "native": args.native}
    for runtime, nodes in labs.items():
        if not serving(nodes[0]):
            p.error("--%s %s: rank 0 does not answer a completion; converge that lab first (see --help)"
                    % (runtime, " ".join(nodes)))  # fmt: skip
    runs: List[Dict[str, object]] = []
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for i in range(args.repeat):
        order = ["container", "native"] if i % 2 == 0 else ["native", "container"]
        for fault in args.faults:
            for runtime in order:
                if runtime not in FAULTS[fault][1]:
                    continue
                run = drill(fault, runtime, labs[runtime], args.timeout)
                run["round"] = i + 1
                runs.append(run)
                print("round %d %-21s %-9s %s" % (i + 1, fault, runtime, "detected %s s, recovered %s s" % (
                    run.get("detected_s"), run.get("recovered_s")) if "error" not in run else run["error"]),
                    flush=True)  # fmt: skip
                if args.json:
                    tmp = args.json + ".tmp"
                    with open(tmp, "w", encoding="utf-8") as handle:
                        json.dump({"started_utc": started, "machine": machine(), "runs": runs}, handle, indent=1)
                    os.replace(tmp, args.json)
    print()
    print("%s; %s-%s UTC; %d round(s), interleaved" % (
        machine(), started, time.strftime("%H:%M", time.gmtime()), args.repeat))  # fmt: skip
    print()
    print("| fault | container: detected | container: recovered | native: detected | native: recovered |")
    print("| --- | --- | --- | --- | --- |")
    for fault in args.faults:
        cells = []
        for runtime in ("container", "native"):
            mine = [r for r in runs if r["fault"] == fault and r["runtime"] == runtime]
            cells += [cell(mine, "detected_s"), cell(mine, "recovered_s")]
        print("| %s | %s |" % (fault, " | ".join(cells)))
    return 0


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    return "%s, %d CPUs (%s), kernel %s" % (platform.node(), os.cpu_count() or 0, model, platform.release())


if __name__ == "__main__":
    sys.exit(main())
