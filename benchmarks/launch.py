# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Time-to-healthy and page-cache peak: the real vLLM engine bare vs through vllm-uma-launch.

Runs in one lab container (image uma-lab/node:bookworm, the lab's vLLM CPU
venv and a generated model mounted read-only), alternating the two ways of
starting the same engine, ``--repeat`` times each:

* ``bare``: ``python -m vllm.entrypoints.openai.api_server --model M ...``
* ``launcher``: ``vllm-uma-launch --engine bench ... -- <the same argv>``
  (lock, pre-evict, adaptive guard, post-evict; the launch_wrapper defaults)

One bare start first is not counted (``--warmup``: the first start in a
fresh container was 58-59 s here, the later ones 44-46 s). Before each run the
page cache is dropped (``echo 3 > drop_caches``, restored nothing: it is
not a setting) and memory is pre-touched (see LAB-NOTES). From
the build machine it samples /proc/meminfo every 50 ms (the kernel is shared
with the container) and polls GET /health on the container's address.
Prints a table; ``--json`` prints one JSON object instead.

    python3 benchmarks/launch.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from _lab import docker, drop_caches, meminfo, node_lib, pretouch, start_node, wait_systemd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024


class Sampler(threading.Thread):
    """Peak of Cached and of Cached - Mapped above the value at start."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.stop = threading.Event()
        first = meminfo()
        self.base_cached = first["Cached"]
        self.base_unmapped = first["Cached"] - first["Mapped"]
        self.peak_cached = 0
        self.peak_unmapped = 0

    def run(self) -> None:
        while not self.stop.is_set():
            m = meminfo()
            self.peak_cached = max(self.peak_cached, m["Cached"] - self.base_cached)
            self.peak_unmapped = max(self.peak_unmapped, m["Cached"] - m["Mapped"] - self.base_unmapped)
            time.sleep(self.interval)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def start_container(name: str, image: str, venv: str, models: str) -> str:
    lib = node_lib()  # the node programs as a node has them (the package and its entry scripts)
    start_node(name, image, ["-v", "%s:/opt/vllm:ro" % venv, "-v", "%s:/models:ro" % models,
                             "-v", "%s:/usr/local/lib/uma-vllm:ro" % lib])  # fmt: skip
    wait_systemd(name)
    return docker("inspect", "-f", "{{ .NetworkSettings.IPAddress }}", name).strip()


def one_run(name: str, ip: str, mode: str, model: str, engine_args: list, timeout: float) -> dict:
    port = 8000
    engine = ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", model,
              "--host", "0.0.0.0", "--port", str(port), *engine_args]  # fmt: skip
    if mode == "launcher":
        argv = ["python3", "/usr/local/lib/uma-vllm/uma_launch.py", "--engine", "bench", "--node-config", "/none",
                "--health-url", "http://127.0.0.1:%d/health" % port, "--model-path", model, "--", *engine]  # fmt: skip
    else:
        argv = engine
    drop_caches()
    sampler = Sampler()
    sampler.start()
    started = time.monotonic()
    proc = subprocess.Popen(
        ["docker", "exec", "-e", "VLLM_CPU_KVCACHE_SPACE=1", name, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ttl = None
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            break
        if healthy("http://%s:%d/health" % (ip, port)):
            ttl = time.monotonic() - started
            break
        time.sleep(0.25)
    if mode == "launcher" and ttl is not None:
        # the launcher's job ends with its post-load clean-up: include it
        for _unused in range(100):
            out = subprocess.run(
                ["docker", "exec", name, "sh", "-c", "ls /var/lib/uma-vllm/launches/bench/latest/launch.json"],
                capture_output=True,
                check=False,
            )
            if out.returncode == 0:
                break
            time.sleep(0.1)
    steps = None
    if mode == "launcher":
        # where the launcher's own time went (its record: each step's t from its start, and duration)
        record = subprocess.run(
            ["docker", "exec", name, "cat", "/var/lib/uma-vllm/launches/bench/latest/launch.json"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        try:
            steps = [
                {k: v for k, v in step.items() if k in ("name", "t", "duration_s")}
                for step in json.loads(record).get("steps", [])
            ]
        except ValueError:
            steps = None
    time.sleep(2)  # the cache after the load settles (post-evict shows here)
    sampler.stop.set()
    sampler.join()
    subprocess.run(["docker", "exec", name, "pkill", "-TERM", "-f", "[v]llm.entrypoints|[u]ma_launch"], check=False)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "exec", name, "pkill", "-KILL", "-f", "[v]llm|[u]ma_"], check=False)
        proc.wait(30)
    subprocess.run(["docker", "exec", name, "rm", "-rf", "/var/lib/uma-vllm/launches/bench/latest"], check=False)
    return {
        "mode": mode,
        "time_to_healthy_s": round(ttl, 2) if ttl is not None else None,
        "peak_cache_growth_mib": round(sampler.peak_cached / MIB, 1),
        "peak_unmapped_growth_mib": round(sampler.peak_unmapped / MIB, 1),
        "launcher_steps": steps,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--image", default="uma-lab/node:bookworm")
    p.add_argument("--venv", default=os.path.join(ROOT, ".cache", "lab", "vllm-venv"))
    p.add_argument("--models", default=os.path.join(ROOT, ".cache", "lab", "models"))
    p.add_argument("--model", default="tiny-1g", help="directory under --models")
    p.add_argument("--pretouch-gib", type=float, default=6.0)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument(
        "--warmup", type=int, default=1, help="bare starts before the measured ones, not counted (default 1)"
    )
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if os.geteuid() != 0:
        p.error("needs root (drop_caches, docker)")
    engine_args = ["--max-model-len", "512", "--max-num-seqs", "4", "--enforce-eager"]
    name = "uma-bench-launch"
    ip = start_container(name, a.image, a.venv, a.models)
    runs = []
    try:
        # The first start in a fresh container took 58-59 s, later ones of either kind 44-46 s
        # (caches inside the container, not the page cache: that is dropped before every run).
        # Warm up so that start does not land on one side.
        for _unused in range(a.warmup):
            pretouch(int(a.pretouch_gib * 1024**3))
            warm = one_run(name, ip, "bare", "/models/" + a.model, engine_args, a.timeout)
            if not a.json:
                print("warm-up  bare     healthy after %ss (not counted)" % warm["time_to_healthy_s"], file=sys.stderr)
        for rep in range(a.repeat):
            order = ["bare", "launcher"] if rep % 2 == 0 else ["launcher", "bare"]
            for mode in order:
                pretouch(int(a.pretouch_gib * 1024**3))
                run = one_run(name, ip, mode, "/models/" + a.model, engine_args, a.timeout)
                run["repeat"] = rep
                runs.append(run)
                if not a.json:
                    print("run %d %-8s healthy after %ss, cache peak +%s MiB (unmapped +%s MiB)" % (
                        rep, mode, run["time_to_healthy_s"], run["peak_cache_growth_mib"],
                        run["peak_unmapped_growth_mib"]), file=sys.stderr, flush=True)  # fmt: skip
                    if run["launcher_steps"]:
                        print("    launcher steps: " + ", ".join(
                            "%s t=%s%s" % (st["name"], st.get("t"),
                                           " (%ss)" % st["duration_s"] if "duration_s" in st else "")
                            for st in run["launcher_steps"]), file=sys.stderr, flush=True)  # fmt: skip
    finally:
        docker("rm", "-f", name, check=False)
    summary = {}
    for mode in ("bare", "launcher"):
        mine = [r for r in runs if r["mode"] == mode and r["time_to_healthy_s"] is not None]
        summary[mode] = {
            "runs": len(mine),
            "time_to_healthy_s_median": statistics.median(r["time_to_healthy_s"] for r in mine) if mine else None,
            "time_to_healthy_s_min": min(r["time_to_healthy_s"] for r in mine) if mine else None,
            "peak_cache_growth_mib_median": (
                statistics.median(r["peak_cache_growth_mib"] for r in mine) if mine else None
            ),
            "peak_unmapped_growth_mib_median": (
                statistics.median(r["peak_unmapped_growth_mib"] for r in mine) if mine else None
            ),
        }
    bare, launcher = summary["bare"], summary["launcher"]
    ratio = None
    if bare["time_to_healthy_s_median"] and launcher["time_to_healthy_s_median"]:
        ratio = round(launcher["time_to_healthy_s_median"] / bare["time_to_healthy_s_median"], 3)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "mem_gib": round(meminfo()["MemTotal"] / 1024**3, 1),
            "kernel": os.uname().release,
            "load_before": os.getloadavg(),
        },
        "model": a.model,
        "engine_args": engine_args,
        "runs": runs,
        "summary": summary,
        "launcher_over_bare_time_to_healthy": ratio,
    }
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        print("| start | time to healthy (median s) | min s | page-cache peak growth (median MiB) | unmapped peak |")
        print("| --- | --- | --- | --- | --- |")
        for mode in ("bare", "launcher"):
            s = summary[mode]
            cells = [mode, s["time_to_healthy_s_median"], s["time_to_healthy_s_min"]]
            cells += [s["peak_cache_growth_mib_median"], s["peak_unmapped_growth_mib_median"]]
            print("| %s |" % " | ".join(str(c) for c in cells))
        print("launcher / bare time to healthy: %s" % ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
