# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner and the launcher on a REAL discrete GPU (a lent NVIDIA machine; nothing here runs in CI).

vLLM is not installed on the lent machines (no network; its CUDA wheel is larger than what can be
carried there), so the engine is lab/vm/uma_loader.py with ``--driver cuda``: a STAND-IN that does a
vLLM 0.32 rank's memory work on the real card through PyTorch: the startup check of
``request_memory`` against ``torch.cuda.mem_get_info()`` taken after the process's CUDA context (what
vLLM's MemorySnapshot reads on a discrete GPU), this rank's part of each tensor of a real safetensors
checkpoint copied onto the card, the KV cache as one allocation of ``--kv-cache-memory-bytes``, then
/health and a completion. The launcher is the collection's own (plugins/module_utils/node/launch/program.py),
run as on a node, with the planner's budget as its plan.

Cases (each one engine start, one after the other; the card is otherwise idle):
  context      the CUDA context of one process: nvidia-smi's free memory before and during
  contexts     (--contexts) two processes' contexts on the card, one after the other, with
               CUDA_MODULE_LOADING=LAZY (the default) and EAGER: what each takes, what the second one sees free
  plan         the planner for this card (uma.vllm.vllm_flags' plan(), unified_memory false, the card's
               CUDA total) with a pinned KV cache -> gmu; the old edge (reserve 0) -> gmu; the new default
               on the same KV -> refused; the largest KV the new default accepts -> gmu
  launch       the plan through the launcher: admission on the GPU's free memory, healthy, a completion,
               stopped by SIGTERM, the card's memory back
  edge-old     the old edge plan's gmu and KV, admission off: vLLM's startup check; then the same plan
               through the GPU admission (refused) and the host admission (host RAM decides)
  edge-new     the new default's largest plan through the launcher: healthy (the context left free)
  edge-new-eager  the same plan, the engine's env CUDA_MODULE_LOADING=EAGER: its larger context fails vLLM's check
  edge-eager   the largest plan the planner makes with that env: healthy (the eager context left free)
  hog          another process holds all but (request - 2 GiB) of the card: the launcher's GPU
               admission refuses, naming the GPU; then the same with --admission-memory host: admitted
               on host MemAvailable, and the engine's own check fails as the GPU admission said
  release      (--release S) a stopping engine: another process holds the same memory and lets it go S
               seconds after the launch starts. Straight to the engine (admission off): vLLM's check fails
               while it is held; through the launcher (GPU admission, --admission-wait 60): it waits for the
               memory and the engine serves. --only-release runs the context probe, the plans and this alone

    python3 benchmarks/gpu_launch_check.py --json gpu_launch_check.json [--pad-gib 4] [--kv-gib 16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOADER = os.path.join(ROOT, "lab", "vm", "uma_loader.py")
# the launcher as a node runs it (main() installs the node package there first: _lab.node_lib)
LAUNCH = os.path.join(ROOT, ".cache", "node-lib", "uma_launch.py")
GIB = 1 << 30
MIB = 1 << 20


def say(msg: str) -> None:
    print("[gpu-check] %s" % msg, flush=True)


def smi() -> List[Dict[str, Any]]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,memory.used,memory.free",
         "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    rows = []
    for line in out.strip().splitlines():
        idx, name, drv, total, used, free = [x.strip() for x in line.split(",")]
        rows.append({"index": int(idx), "name": name, "driver": drv, "total_mib": int(total),
                     "used_mib": int(used), "free_mib": int(free)})  # fmt: skip
    return rows


CONTEXT_PROBE = r"""
import json, subprocess, sys, torch
def free():
    return int(subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
               capture_output=True, text=True).stdout.split()[0])
before = free()
torch.cuda.set_device(0); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
f, t = torch.cuda.mem_get_info()
print(json.dumps({"smi_free_before_mib": before, "smi_free_during_mib": free(), "cuda_free": f, "cuda_total": t,
                  "torch": torch.__version__, "cuda": torch.version.cuda}))
"""

CONTEXT_HOLD = r"""
import json, sys, torch
torch.cuda.set_device(0); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
f, t = torch.cuda.mem_get_info()
print(json.dumps({"cuda_free": f, "cuda_total": t}), flush=True)
sys.stdin.read()
"""


def contexts(loading: str, timeout: float = 180.0) -> Dict[str, Any]:
    """Two processes' CUDA contexts on one card, one after the other, with CUDA_MODULE_LOADING=loading:
    nvidia-smi's free memory before, with one and with both; what the second one's mem_get_info saw
    (the free memory a second engine's startup check would compare)."""
    env = dict(os.environ, CUDA_MODULE_LOADING=loading)
    row: Dict[str, Any] = {"loading": loading, "smi_free_mib": [smi()[0]["free_mib"]], "seen": []}
    procs: List[subprocess.Popen] = []
    try:
        for _index in range(2):
            t0 = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-c", CONTEXT_HOLD], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
            procs.append(proc)
            assert proc.stdout is not None
            ready = select.select([proc.stdout], [], [], timeout)[0]
            if not ready:
                row["error"] = "no context within %ss" % timeout
                return row
            row["seen"].append(json.loads(proc.stdout.readline()))
            row.setdefault("start_s", []).append(round(time.monotonic() - t0, 2))
            row["smi_free_mib"].append(smi()[0]["free_mib"])
        free = row["smi_free_mib"]
        row["first_mib"] = free[0] - free[1]
        row["second_mib"] = free[1] - free[2]
        return row
    finally:
        for proc in procs:
            if proc.stdin:
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


HOG = r"""
import sys, time, torch
n = int(sys.argv[1]); x = torch.empty(n, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("hog holds", n, flush=True); time.sleep(float(sys.argv[2]))
"""


def collections_path(work: str) -> str:
    """ansible_collections/uma/vllm -> this checkout (what tests/setup.sh links), for the planner."""
    base = os.path.join(work, "ac")
    link = os.path.join(base, "ansible_collections", "uma", "vllm")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.islink(link):
        os.symlink(ROOT, link)
    return base


def planner(work: str):
    sys.path.insert(0, collections_path(work))
    from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as _vllm_plan

    return _vllm_plan


def http(url: str, body: Optional[dict] = None, timeout: float = 5.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read().decode() or "null")


def engine_argv(model: str, gmu: float, kv: int, port: int) -> List[str]:
    return [sys.executable, LOADER, model, "--driver", "cuda", "--allocator", "torch", "--gpu-memory-utilization",
            str(gmu), "--kv-cache-memory-bytes", str(kv), "--port", str(port), "--host", "127.0.0.1",
            "--max-model-len", "512"]  # fmt: skip


def stand_in_facts(text: str) -> Dict[str, Any]:
    for line in text.splitlines():
        if "stand-in facts: " in line:
            return json.loads(line.split("stand-in facts: ", 1)[1])
    return {}


def launch(work: str, name: str, model: str, plan_budget: Dict[str, Any], gmu: float, kv: int, port: int,
           extra: List[str], expect_healthy: bool, timeout: float = 240.0,
           cfg_extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:  # fmt: skip
    """The launcher with the stand-in as its engine; healthy -> completion, SIGTERM, the card's memory back."""
    state = os.path.join(work, "state-" + name)
    cfg = {"command": engine_argv(model, gmu, kv, port), "health_url": "http://127.0.0.1:%d/health" % port,
           "model_path": model, "plan": plan_budget, **(cfg_extra or {})}  # fmt: skip
    cfg_path = os.path.join(work, name + ".json")
    with open(cfg_path, "w") as handle:
        json.dump(cfg, handle)
    argv = [sys.executable, LAUNCH, "--engine", name, "--config", cfg_path, "--node-config", "/nonexistent",
            "--lock-path", os.path.join(work, name + ".lock"), "--state-dir", state, "--health-timeout", "200",
            "--admission-wait", "5", *extra]  # fmt: skip
    log_path = os.path.join(work, name + ".log")
    t0 = time.monotonic()
    used_before = smi()[0]["used_mib"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    row: Dict[str, Any] = {"case": name, "gmu": gmu, "kv_bytes": kv, "used_before_mib": used_before,
                           "launcher_argv_extra": extra, "config_extra": cfg_extra or {}}  # fmt: skip
    healthy = False
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        try:
            status, _body = http(cfg["health_url"], timeout=2)
            healthy = status == 200
        except OSError:
            healthy = False
        if healthy:
            break
        time.sleep(0.5)
    row["healthy"] = healthy
    row["to_healthy_s"] = round(time.monotonic() - t0, 2) if healthy else None
    if healthy:
        status, body = http("http://127.0.0.1:%d/v1/completions" % port, {"prompt": "hi", "max_tokens": 2})
        row["completion_status"] = status
        row["completion_ok"] = status == 200 and bool(body and body.get("choices"))
        row["used_serving_mib"] = smi()[0]["used_mib"]
        deadline = time.monotonic() + 30  # the launcher's own health wait ends too (its engine-healthy step)
        while time.monotonic() < deadline and proc.poll() is None:
            with open(log_path) as handle:
                if " engine-healthy " in handle.read():
                    break
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        row["exit_code"] = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        row["exit_code"] = proc.wait()
        row["killed"] = True
    time.sleep(1.0)
    row["used_after_mib"] = smi()[0]["used_mib"]
    with open(log_path) as handle:
        text = handle.read()
    row["stand_in_facts"] = stand_in_facts(text)
    row["engine_errors"] = [ln[-400:] for ln in text.splitlines() if "ValueError" in ln or "OutOfMemory" in ln][:3]
    rec = os.path.join(state, "launches", name, "latest", "launch.json")
    if os.path.exists(rec):
        with open(rec) as handle:
            record = json.load(handle)
        row["admission"] = record.get("admission")
        row["launch_exit_code"] = record.get("exit_code")
    row["log_tail"] = text.splitlines()[-12:]
    row["as_expected"] = healthy == expect_healthy
    say("%s: healthy=%s exit=%s to_healthy=%s admission=%s" % (
        name, healthy, row["exit_code"], row["to_healthy_s"],
        json.dumps({k: v for k, v in (row.get("admission") or {}).items() if k != "gpus"})[:400]))  # fmt: skip
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--json", required=True)
    p.add_argument("--work", default="/tmp/gpu-launch-check")
    p.add_argument("--pad-gib", type=float, default=4.0, help="checkpoint size (lab/make_model.py --pad-gib)")
    p.add_argument("--kv-gib", type=float, default=16.0, help="the launch case's pinned KV cache")
    p.add_argument("--contexts", action="store_true",
                   help="also two processes' contexts on the card, CUDA_MODULE_LOADING LAZY and EAGER")  # fmt: skip
    p.add_argument(
        "--release",
        type=float,
        default=0.0,
        help="also the release case: the other process lets its memory go after this many seconds",
    )
    p.add_argument("--only-release", action="store_true", help="of the launch cases, the release case alone")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _lab import node_lib

    node_lib(os.path.dirname(LAUNCH))
    out: Dict[str, Any] = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "cases": []}

    def save() -> None:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1, sort_keys=True)

    out["machine"]["gpus"] = smi()
    say("GPU: %s" % json.dumps(out["machine"]["gpus"]))
    ctx = json.loads(subprocess.run([sys.executable, "-c", CONTEXT_PROBE], check=True, capture_output=True,
                                    text=True, timeout=120).stdout.strip().splitlines()[-1])  # fmt: skip
    ctx["context_mib"] = ctx["smi_free_before_mib"] - ctx["smi_free_during_mib"]
    out["context"] = ctx
    say("CUDA context: %s" % json.dumps(ctx))
    save()
    if args.contexts:
        out["contexts"] = [contexts(mode) for mode in ("LAZY", "EAGER")]
        for row in out["contexts"]:
            say("contexts %s: %s" % (row["loading"], json.dumps(row)))
        save()

    model = os.path.join(args.work, "model")
    t0 = time.monotonic()
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "lab", "make_model.py"), "--out", model, "--shards", "4",
                        "--pad-gib", str(args.pad_gib)], check=True, capture_output=True, timeout=600)  # fmt: skip
    out["model"] = {"pad_gib": args.pad_gib, "make_s": round(time.monotonic() - t0, 1)}
    rank = json.loads(subprocess.run([sys.executable, LOADER, model, "--rank-bytes", "--allocator", "torch"],
                                     check=True, capture_output=True, text=True).stdout)  # fmt: skip
    out["model"]["rank_bytes"] = rank
    with open(os.path.join(model, "config.json")) as handle:
        config = json.load(handle)

    plan_mod = planner(args.work)
    total_gib = ctx["cuda_total"] / GIB
    base = {"model": model, "model_config": config, "weights_bytes": rank["weight_driver_bytes"],
            "total_memory_gib": total_gib, "unified_memory": False, "vllm_version": "0.32.0",
            "max_model_len": 512, "max_num_seqs": 4}  # fmt: skip

    def plan(**extra: Any) -> Dict[str, Any]:
        params = dict(base, **extra)
        try:
            budget = plan_mod.plan(params)["budget"]
            return {"ok": True, "budget": budget, "gmu": budget["gpu_memory_utilization"],
                    "kv": budget["kv_cache_bytes"], "reserve_bytes": budget["reserve_bytes"]}  # fmt: skip
        except Exception as exc:  # PlanRefused/UmaError: kept as the case's result
            return {"ok": False, "refused": str(exc)[:600]}

    pa = plan(kv_cache_memory_bytes=int(args.kv_gib * GIB))
    probe = pa["budget"]
    kv_old = ctx["cuda_total"] - probe["weights_per_rank_bytes"] - probe["activation_reserve_bytes"] - int(0.41 * GIB)
    old = plan(kv_cache_memory_bytes=kv_old, reserve_gib=0)
    new_same = plan(kv_cache_memory_bytes=kv_old)
    room = ctx["cuda_total"] - probe["weights_per_rank_bytes"] - probe["activation_reserve_bytes"]
    kv_new = room - int(probe.get("cuda_context_bytes") or 0) - 64 * MIB
    kv_new -= kv_new % (2 * MIB)
    new_edge = plan(kv_cache_memory_bytes=kv_new)
    # the engine's env with CUDA_MODULE_LOADING=EAGER: the planner keeps the larger context it measured
    eager_env = {"CUDA_MODULE_LOADING": "EAGER"}
    eager_ctx = plan(kv_cache_memory_bytes=int(args.kv_gib * GIB), env=eager_env)["budget"]["cuda_context_bytes"]
    kv_eager = room - int(eager_ctx) - 64 * MIB
    kv_eager -= kv_eager % (2 * MIB)
    eager_edge = plan(kv_cache_memory_bytes=kv_eager, env=eager_env)
    out["plans"] = {"launch": pa, "old_edge": old, "new_same_kv": new_same, "new_edge": new_edge,
                    "kv_old": kv_old, "kv_new": kv_new, "eager_edge": eager_edge, "kv_eager": kv_eager}  # fmt: skip
    say(
        "plans: launch gmu %s; old edge gmu %s; new default on that KV: %s; new edge gmu %s"
        % (pa.get("gmu"), old.get("gmu"), "refused" if not new_same["ok"] else new_same.get("gmu"), new_edge.get("gmu"))
    )
    save()

    port = 8123
    if args.only_release:
        out["cases"].extend(release(args, model, pa, port))
        return finish(out, save)
    out["cases"].append(launch(args.work, "launch", model, pa["budget"], pa["gmu"], pa["kv"], port, [], True))
    save()
    if old["ok"]:
        # the old plan straight to the engine (no admission): vLLM's own startup check decides
        out["cases"].append(launch(args.work, "edge-old", model, old["budget"], old["gmu"], kv_old, port, [], False,
                                   cfg_extra={"admission": False}))  # fmt: skip
        # the same plan through the GPU admission: refused before any weight is read
        out["cases"].append(launch(args.work, "edge-old-gpu", model, old["budget"], old["gmu"], kv_old, port,
                                   ["--admission-memory", "gpu"], False))  # fmt: skip
        # and through the host admission (before the fix, on every plan): host RAM is not the card's
        out["cases"].append(launch(args.work, "edge-old-host", model, old["budget"], old["gmu"], kv_old, port,
                                   ["--admission-memory", "host"], False))  # fmt: skip
        save()
    if new_edge["ok"]:
        out["cases"].append(launch(args.work, "edge-new", model, new_edge["budget"], new_edge["gmu"],
                                   new_edge["kv"], port, [], True))  # fmt: skip
        # the same plan (made for lazy loading), the engine's env CUDA_MODULE_LOADING=EAGER: a larger context
        out["cases"].append(launch(args.work, "edge-new-eager", model, new_edge["budget"], new_edge["gmu"],
                                   new_edge["kv"], port, [], False, cfg_extra={"env": eager_env}))  # fmt: skip
        save()
    if eager_edge["ok"]:
        # the plan made with that env: the planner keeps the eager context free
        out["cases"].append(launch(args.work, "edge-eager", model, eager_edge["budget"], eager_edge["gmu"],
                                   eager_edge["kv"], port, [], True, cfg_extra={"env": eager_env}))  # fmt: skip
        save()
    # another process holds the card: leave (request - 2 GiB) free
    hog, out["hog"] = hog_for(pa["budget"]["requested_memory_bytes"], 300)
    say("hog: %s" % json.dumps(out["hog"]))
    try:
        out["cases"].append(launch(args.work, "hog-gpu", model, pa["budget"], pa["gmu"], pa["kv"], port, [], False))
        save()
        out["cases"].append(launch(args.work, "hog-host", model, pa["budget"], pa["gmu"], pa["kv"], port,
                                   ["--admission-memory", "host"], False))  # fmt: skip
    finally:
        hog.kill()
        hog.wait()
    if args.release:
        out["cases"].extend(release(args, model, pa, port))
    return finish(out, save)


def hog_for(request: int, seconds: float) -> Any:
    """Another process holding all but (request - 2 GiB) of the card for SECONDS (then it exits, its memory back)."""
    free_now = smi()[0]["free_mib"] * MIB
    hold = max(0, free_now - request + 2 * GIB)
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(hold), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert hog.stdout is not None
    said = hog.stdout.readline().strip()
    return hog, {"hold_bytes": hold, "said": said, "free_mib_with_hog": smi()[0]["free_mib"], "hold_s": seconds}


def release(args: Any, model: str, pa: Dict[str, Any], port: int) -> List[Dict[str, Any]]:
    """A stopping engine: the memory is held when the launch starts and let go args.release seconds later."""
    request = pa["budget"]["requested_memory_bytes"]
    rows = []
    for name, extra, cfg_extra, expect in (
        ("release-direct", [], {"admission": False}, False),  # vLLM's own check, while the memory is held
        ("release-gpu", ["--admission-memory", "gpu", "--admission-wait", "60"], None, True),
    ):
        hog, held = hog_for(request, args.release)
        say("%s: %s" % (name, json.dumps(held)))
        t0 = time.monotonic()
        try:
            row = launch(args.work, name, model, pa["budget"], pa["gmu"], pa["kv"], port, extra, expect,
                         cfg_extra=cfg_extra)  # fmt: skip
        finally:
            hog.wait(timeout=args.release + 120)
        row["hog"] = dict(held, exited_after_s=round(time.monotonic() - t0, 1), exit=hog.returncode)
        rows.append(row)
    return rows


def finish(out: Dict[str, Any], save: Any) -> int:
    out["all_as_expected"] = all(c["as_expected"] for c in out["cases"])
    save()
    say("all as expected: %s" % out["all_as_expected"])
    for c in out["cases"]:
        adm = c.get("admission") or {}
        facts = c.get("stand_in_facts") or {}
        say("%-9s healthy=%-5s exit=%s admitted=%s memory=%s free_at_check=%s requested=%s used serving/after=%s/%s"
            % (c["case"], c["healthy"], c["exit_code"], adm.get("admitted"), adm.get("memory"),
               facts.get("free_at_check"), facts.get("requested_at_check"), c.get("used_serving_mib"),
               c.get("used_after_mib")))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
