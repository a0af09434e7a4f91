# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Cold launches of the UMA loader on the VM lab node (issue 20 item 4).

Each launch runs lab/vm/uma_loader.py (a stand-in for vLLM on a GB10 rank) in the VM guest
against fakegb10 (a stand-in for the GB10 driver) after ``echo 3 > drop_caches``, and
records whether it reached /health 200 and answered a completion, the time to healthy,
the page-cache peak, MemAvailable at the startup check, free order-9 blocks before the KV
allocation, the driver's fallbacks/failures and the /proc/vmstat deltas
(allocstall, compact_stall, oom_kill). Configurations, interleaved (a b a b ...):

  a  nothing: the guest's own boot values of the knobs below
  b  the published field fix, scaled to the VM: vm.min_free_kbytes = 4 GiB of a 121 GiB node
     scaled to the guest's MemTotal, vfs_cache_pressure 200, dirty_ratio 5,
     dirty_background_ratio 2, read_ahead_kb 8 on the model disk, and
     ``echo 3 > drop_caches`` every 0.1 s from the launch until healthy (or failed)
  r  the collection's reserve alone: node_prep's vm.min_free_kbytes rule (uma-3pct-v1) for a
     121 GiB Spark, scaled to the guest's MemTotal like b's (the rule applied to the guest's
     own 2.9 GiB would hit its 256 MiB floor, which does not scale)
  g  the collection's guard alone: uma_guard.py with the launcher's defaults (adaptive,
     0.1 s, 16 MiB threshold, --paths the model), started before the loader as the launcher
     starts it (the load waits for the guard's first status), stopped at /health 200
  k  the collection's node-side defaults together, BY HAND (not through site.yml): r's
     reserve, node_prep's vfs_cache_pressure 200, dirty_ratio 5, dirty_background_ratio 2,
     and g's guard (the launcher's readahead window is off by default, so none)

  d  the collection's admission alone: the real launcher (plugins/module_utils/node/launch/program.py and its node
     files, copied into the guest) with the loader as its engine, guard off, pre_evict none, no eviction
     after healthy, admission on the host's MemAvailable against the loader's startup request
     (ceil(MemTotal x --gmu)), waiting up to --admission-wait s; the guest's own knobs as in a

  p  a bounded prefetch (benchmarks/shard_prefetch.py, an experiment, not the collection's): shard 0 read
     ahead while the loader starts, then one shard ahead of the one it has mapped, each shard evicted once
     unmapped; the guest's own knobs as in a

  c  the collection itself: ``ansible-playbook site.yml -i inventories/vm`` once (node_prep with the
     reserve of r, launch_wrapper, vllm_service: the planner sizes the KV cache from the guest's
     RAM, the reserve and the rank's weights from ``uma_loader.py --rank-bytes``), then each launch
     is ``systemctl start uma-vllm@vm`` (the launcher's lock, eviction, admission, guard, then the
     loader), its record read from the launcher; --kv and --gmu do not apply (the plan's are used)

  lab/vm.sh up && lab/vm.sh module
  python3 benchmarks/uma_vm.py --launches 3
  lab/vm.sh down

--hold MIB:S (any configuration): a second process in the guest (``uma_vm.py --hold-guest``) takes MIB of
fakegb10 memory (pinned, as a stopping engine's) right before each launch and lets it go S seconds later:
what the launcher's admission waits for.

The host part copies the loader (two files), this file and fakegb10.ko into the guest over ``lab/vm.sh
ssh``, loads the module, runs each launch as ``python3 /root/uma_vm.py --guest ...`` (stdlib
only) and prints the table; the guest's knobs are restored at the end. Nothing on the host
changes (the VM's knobs are its own).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VM_SH = os.path.join(ROOT, "lab", "vm.sh")
KNOBS = {
    "min_free_kbytes": "/proc/sys/vm/min_free_kbytes",
    "vfs_cache_pressure": "/proc/sys/vm/vfs_cache_pressure",
    "dirty_ratio": "/proc/sys/vm/dirty_ratio",
    "dirty_background_ratio": "/proc/sys/vm/dirty_background_ratio",
    "read_ahead_kb": "/sys/block/vdb/queue/read_ahead_kb",
}
CONFIGS = ("a", "b", "r", "g", "k", "c", "p", "d")
# the collection's node programs in the guest, one directory as the node's lib dir: g's and k's guard, d's launcher
NODE_LIB = "/root/launcher"
SPARK_RAM = 121 * 1024**3
GUARD_KEYS = ("evicted_bytes", "evictions", "cpu_seconds", "stop_reason", "ticks", "peak_cache_mib", "elapsed_s",
              "cpu_user_s", "cpu_sys_s", "major_faults", "minor_faults", "sweeps", "file_checks", "triggers",
              "residency_method", "locked_kib", "lock_error", "held_ticks")  # fmt: skip
VMSTAT = ("allocstall_normal", "allocstall_movable", "allocstall_dma32", "compact_stall", "compact_fail", "oom_kill")
KERNEL_WORDS = ("NVRM", "fakegb10", "oom-killer", "Out of memory", "Killed process")


# ---------------------------------------------------------------------------
# in the guest


def read(path):
    with open(path, encoding="ascii") as fh:
        return fh.read().strip()


def write(path, value):
    with open(path, "w", encoding="ascii") as fh:
        fh.write(str(value))


def vmstat():
    out = {}
    for line in read("/proc/vmstat").splitlines():
        key, value = line.split()
        if key in VMSTAT:
            out[key] = int(value)
    return out


def meminfo(key):
    for line in read("/proc/meminfo").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def kernel_lines(after=-1.0):
    """dmesg lines stamped later than ``after`` (by time: a long stall report can wrap the buffer)."""
    out = []
    for line in subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout.splitlines():
        try:
            stamp = float(line[1 : line.index("]")])
        except ValueError:
            continue
        if stamp > after:
            out.append(line)
    return out


def last_stamp():
    lines = kernel_lines()
    return float(lines[-1][1 : lines[-1].index("]")]) if lines else -1.0


def knobs_for(config, defaults, reserve_spark_kb=0, site=None):
    memtotal_kb = meminfo("MemTotal") // 1024
    scaled = reserve_spark_kb * memtotal_kb // (SPARK_RAM // 1024)
    if config == "c":  # what node_prep set (read after site.yml), written again: other configurations change them
        return dict(site or defaults)
    if config in ("a", "g", "p", "d"):
        return dict(defaults)
    if config == "r":
        return dict(defaults, min_free_kbytes=scaled)
    if config == "k":
        return dict(defaults, min_free_kbytes=scaled, vfs_cache_pressure=200, dirty_ratio=5, dirty_background_ratio=2)
    return {
        "min_free_kbytes": memtotal_kb * 4 // 121,
        "vfs_cache_pressure": 200,
        "dirty_ratio": 5,
        "dirty_background_ratio": 2,
        "read_ahead_kb": 8,
    }


class DirectLaunch:
    """a, b, r, g, k: the loader started here (and the guard beside it for g and k)."""

    def __init__(self, args, url):
        self.args, self.url = args, url
        self.log_path = "/root/launch-%s-%d.log" % (args.guest, args.index)
        self.guard, self.guard_status = None, "/root/guard-%s-%d.json" % (args.guest, args.index)
        self.proc = None
        self.prefetch, self.prefetch_summary = None, None

    def loader_cmd(self):
        args = self.args
        return [sys.executable, "/root/uma_loader.py", "/srv/model", "--tensor-parallel-size", str(args.tp), "--rank",
                str(args.rank), "--gpu-memory-utilization", str(args.gmu), "--kv-cache-memory-bytes", args.kv,
                "--port", str(args.port), "--host", "127.0.0.1", "--allocator", args.allocator]  # fmt: skip

    def start(self):
        args = self.args
        cmd = self.loader_cmd()
        if args.guest in ("g", "k"):
            if os.path.exists(self.guard_status):
                os.unlink(self.guard_status)
            # the guard's own defaults (mode, interval, threshold), which the launcher passes on unchanged;
            # --max-duration is the launcher's guard_max_duration
            self.guard = subprocess.Popen([
                sys.executable, NODE_LIB + "/uma_guard.py", "--name", "vm", "--max-duration", "1800",
                "--until-url", self.url + "/health", "--status-file", self.guard_status, "--paths", "/srv/model"]
                + (["--lock-memory"] if args.guard_lock_memory else []),
                stdin=subprocess.DEVNULL)  # fmt: skip
            while not os.path.exists(self.guard_status) and self.guard.poll() is None:  # the guard watches first
                time.sleep(0.05)
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        if args.guest == "p":
            # the bounded prefetch (benchmarks/shard_prefetch.py): shard 0 while the loader starts, then one
            # shard ahead of the mapped one, each consumed shard evicted
            self.prefetch = subprocess.Popen([sys.executable, "/root/shard_prefetch.py", "--pid", str(self.proc.pid),
                                              "--paths", "/srv/model", "--ahead", "1", "--first"],
                                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)  # fmt: skip

    def alive(self):
        return self.proc.poll() is None

    def stop(self, healthy=False):
        if self.proc.poll() is None:
            self.proc.terminate()
        rc = self.proc.wait(timeout=60)
        summary = None
        if self.prefetch is not None:
            out, _err = self.prefetch.communicate(timeout=120)
            try:
                self.prefetch_summary = json.loads(out.decode().strip().splitlines()[-1])
            except (ValueError, IndexError) as err:
                self.prefetch_summary = {"error": "prefetch: %s" % err}
        if self.guard is not None:
            if self.guard.poll() is None:
                self.guard.terminate()
            self.guard.wait(timeout=60)
            try:
                with open(self.guard_status, encoding="utf-8") as fh:
                    st = json.load(fh)
                summary = {k: st.get(k) for k in GUARD_KEYS}
            except (OSError, ValueError) as err:
                summary = {"error": str(err)}
        with open(self.log_path, encoding="utf-8") as fh:
            return rc, fh.read(), summary, {}


class LauncherLaunch(DirectLaunch):
    """d: the loader started by the collection's launcher (its node files in NODE_LIB), with its admission
    alone: guard off, pre_evict none, no eviction after healthy; the need is the loader's startup request."""

    DIR = "/root/d"
    RECORD = DIR + "/state/launches/vmd/latest/launch.json"

    def start(self):
        args = self.args
        os.makedirs(self.DIR, exist_ok=True)
        need = math.ceil(meminfo("MemTotal") * float(args.gmu))  # the loader's (vLLM's) startup request
        config = {
            "engine": "vmd", "command": self.loader_cmd(), "health_url": self.url + "/health",
            "model_path": "/srv/model", "guard": False, "pre_evict": "none", "evict_after_healthy": False,
            "admission": True, "admission_memory": "host", "admission_request_bytes": need,
            "admission_wait_s": float(args.admission_wait), "watch_ranks": False,
        }  # fmt: skip
        with open(self.DIR + "/vmd.json", "w", encoding="utf-8") as fh:
            json.dump(config, fh)
        if os.path.exists(self.RECORD):
            os.unlink(self.RECORD)
        cmd = [sys.executable, NODE_LIB + "/uma_launch.py", "--engine", "vmd", "--config", self.DIR + "/vmd.json",
               "--node-config", "/nonexistent", "--lock-path", self.DIR + "/launch.lock",
               "--state-dir", self.DIR + "/state"]  # fmt: skip
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def stop(self, healthy=False):
        if healthy:
            until_launcher_saw_healthy(self.log_text, lambda: self.proc.poll() is None)
        rc, text, _guard, _launcher = super().stop(healthy)
        try:
            with open(self.RECORD, encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError) as err:
            record = {"error": str(err)}
        keep = {k: record.get(k) for k in ("admission", "exit_code", "healthy_at", "failed_at", "error")}
        return rc, text, None, keep

    def log_text(self):
        with open(self.log_path, encoding="utf-8") as fh:
            return fh.read()


def until_launcher_saw_healthy(text, alive=lambda: True, seconds=15.0):
    """The launcher polls /health once a second: a stop before it saw the 200 would be its failed launch. Wait
    (bounded) for its ``engine-healthy`` step in ``text()`` (its log or journal) while ``alive()``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and alive() and "] engine-healthy " not in text():
        time.sleep(0.3)


class Holder:
    """--hold MIB:S: a second process holding MIB of fakegb10 memory from just before the launch for S seconds."""

    def __init__(self, spec):
        self.mib, self.seconds = parse_hold(spec)
        self.proc, self.facts = None, {}

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "/root/uma_vm.py", "--hold-guest", "%d:%g" % (
            self.mib, self.seconds)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        said = self.proc.stdout.readline().strip()
        self.facts = {"mib": self.mib, "s": self.seconds, "said": said,
                      "memavailable_with_hold_mib": meminfo("MemAvailable") >> 20}  # fmt: skip

    def wait(self):
        self.proc.stdout.read()
        self.facts["exit"] = self.proc.wait(timeout=self.seconds + 120)
        return self.facts


def parse_hold(spec):
    mib, _sep, seconds = spec.partition(":")
    return int(mib), float(seconds)


def hold_guest(spec):
    """In the guest: take MIB of fakegb10 memory (pinned, zeroed, as an engine's), say so, hold it S s, let go."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import uma_loader_drivers  # the guest's copy beside this file (setup)

    mib, seconds = parse_hold(spec)
    driver = uma_loader_drivers.FakeGB10Driver()
    driver.alloc(mib << 20)
    print("held %d MiB" % mib, flush=True)
    time.sleep(seconds)
    driver.close()
    return 0


class SiteLaunch:
    """c: the engine site.yml installed (inventories/vm), started as systemd starts it: the launcher's lock,
    eviction, admission, guard (as configured by the role), then the loader; its record read afterwards."""

    UNIT = "uma-vllm@vm.service"
    RECORD = "/var/lib/uma-vllm/launches/vm/latest/launch.json"

    def __init__(self, args, url):
        self.args, self.url, self.since = args, url, None
        self.systemctl("stop")  # a guest rebooted after a hang starts the enabled engine itself
        self.systemctl("reset-failed")

    @staticmethod
    def systemctl(*words):
        return subprocess.run(["systemctl", *words, SiteLaunch.UNIT], capture_output=True, text=True, check=False)

    def start(self):
        self.since = time.time()
        self.systemctl("start", "--no-block")

    def alive(self):
        state = self.systemctl("show", "-p", "ActiveState", "--value").stdout.strip()
        return state in ("activating", "active", "reloading") or time.time() - self.since < 2

    def journal(self, unit):
        """What UNIT logged since this launch started."""
        cmd = ["journalctl", "-u", unit, "-o", "cat", "--no-pager", "--since", "@%d" % int(self.since)]
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout

    def record(self):
        try:
            with open(self.RECORD, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError) as err:
            return {"error": str(err)}

    def stop(self, healthy=False):
        if healthy:  # its record is written at the end, so its own journal line is what says it saw 200
            until_launcher_saw_healthy(lambda: self.journal(self.UNIT))
        self.systemctl("stop")  # also cancels the restart systemd schedules after a failure
        self.systemctl("reset-failed")
        text = self.journal(self.UNIT)
        record = self.record()
        st = record.get("guard_status") or {}
        summary = {k: st.get(k) for k in GUARD_KEYS} if st else None
        if summary is not None:  # the line under which it evicted (the launcher's auto: the engine's request)
            summary["act_below_free_mib"] = (st.get("config") or {}).get("act_below_free_mib")
        keep = {k: record.get(k) for k in ("admission", "exit_code", "healthy_at", "failed_at", "kv_alloc_t",
                                           "page_cache_peak_mib", "error")}  # fmt: skip
        keep["plan_kv_bytes"] = (record.get("plan") or {}).get("kv_cache_bytes")
        # what the engine's watchdog did meanwhile (site.yml runs one beside every started engine)
        lines = self.journal("uma-vllm-watchdog@vm.service").splitlines()
        acts = [ln.split("] ", 1)[-1].split(" evidence=", 1)[0] for ln in lines if ln.startswith("[uma-vllm-watchdog")]
        keep["watchdog"] = {word: sum(1 for a in acts if a.startswith(word + ":"))
                            for word in ("restart", "evict", "gave_up", "floor-while-starting")}  # fmt: skip
        keep["watchdog"]["lines"] = [a[:160] for a in acts if not a.startswith(("evict:", "phase:"))][:6]
        return record.get("exit_code"), text, summary, keep


def guest_launch(args):
    defaults = json.loads(args.defaults)
    knobs = knobs_for(args.guest, defaults, args.reserve_spark_kb, json.loads(args.site_knobs or "null"))
    url = "http://127.0.0.1:%d" % args.port
    launch = {"c": SiteLaunch, "d": LauncherLaunch}.get(args.guest, DirectLaunch)(args, url)
    for name, value in knobs.items():
        write(KNOBS[name], value)
    subprocess.run(["sync"], check=False)
    write("/proc/sys/vm/drop_caches", 3)
    before, since = vmstat(), last_stamp()
    stop = threading.Event()

    def drop_loop():
        while not stop.wait(0.1):
            write("/proc/sys/vm/drop_caches", 3)

    holder = Holder(args.hold) if args.hold else None
    if holder is not None:
        holder.start()
    t0 = time.monotonic()
    launch.start()
    if args.guest == "b":
        threading.Thread(target=drop_loop, daemon=True).start()
    healthy_s, cached_peak, completion = None, 0, False
    while time.monotonic() - t0 < args.timeout and launch.alive():
        cached_peak = max(cached_peak, meminfo("Cached"))
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    healthy_s = time.monotonic() - t0
                    break
        except OSError:
            time.sleep(0.25)
    stop.set()
    if healthy_s is not None:
        body = json.dumps({"model": "/srv/model", "prompt": "ping", "max_tokens": 1}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                completion = bool(json.loads(resp.read())["choices"])
        except (OSError, ValueError, KeyError):
            completion = False
    rc, text, guard_summary, launcher = launch.stop(healthy_s is not None)
    hold = holder.wait() if holder is not None else None
    after = vmstat()
    facts = {}
    for line in text.splitlines():
        # the loader's own line (the launcher's launch-failed line quotes the engine's tail, cut short)
        if line.startswith("(") and "[uma_loader] stand-in facts: " in line:
            facts = json.loads(line.split("stand-in facts: ", 1)[1])
    errors = [ln.split("] ", 1)[-1][:200] for ln in text.splitlines() if " ERROR " in ln and "facts" not in ln]
    kernel = [ln for ln in kernel_lines(since) if any(w in ln for w in KERNEL_WORDS)]
    result = {
        "config": args.guest, "index": args.index, "healthy": healthy_s is not None, "completion": completion,
        "healthy_s": round(healthy_s, 1) if healthy_s is not None else None, "exit": rc,
        "cached_peak_mib": cached_peak >> 20, "facts": facts, "errors": errors, "kernel": kernel[:12],
        "vmstat": {k: after.get(k, 0) - before.get(k, 0) for k in VMSTAT}, "knobs": knobs, "guard": guard_summary,
    }  # fmt: skip
    if launcher:
        result["launcher"] = launcher
    if hold is not None:
        result["hold"] = hold
    if getattr(launch, "prefetch_summary", None) is not None:
        result["prefetch"] = launch.prefetch_summary
    print(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------
# on the host


def ssh(cmd, stdin=None, timeout=900):
    res = subprocess.run(["bash", VM_SH, "ssh", cmd], input=stdin, capture_output=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise SystemExit("uma_vm.py: in the guest, %r failed (%d): %s" % (cmd, res.returncode, res.stderr.decode()))
    return res.stdout.decode()


def setup(args):
    cache = os.environ.get("UMA_VM_CACHE", os.path.join(ROOT, ".cache", "vm"))
    ko = os.path.join(cache, "fakegb10", "fakegb10.ko")
    if not os.path.exists(ko):
        raise SystemExit("uma_vm.py: %s is missing; run lab/vm.sh module first" % ko)
    vm_dir = os.path.join(ROOT, "lab", "vm")
    for src, dst in ((os.path.join(vm_dir, "uma_loader.py"), "/root/uma_loader.py"),
                     (os.path.join(vm_dir, "uma_loader_drivers.py"), "/root/uma_loader_drivers.py"),
                     (os.path.abspath(__file__), "/root/uma_vm.py"), (ko, "/root/fakegb10.ko"),
                     (os.path.join(ROOT, "benchmarks", "shard_prefetch.py"), "/root/shard_prefetch.py")):  # fmt: skip
        with open(src, "rb") as fh:
            ssh("cat > %s" % dst, stdin=fh.read())
    ssh("rm -rf %s" % NODE_LIB)
    for name, text in node_program_files():
        ssh("mkdir -p %s && cat > %s/%s" % (os.path.dirname(NODE_LIB + "/" + name), NODE_LIB, name),
            stdin=text.encode("utf-8"))  # fmt: skip
    ssh("test -e /dev/fakegb10 || insmod /root/fakegb10.ko")
    ssh("dmesg -n 7")  # every kernel message to the serial console too: a guest that hangs keeps its log there
    return guest_knobs()


def node_program_files():
    """(path under lib_dir, text) of the node programs as the launch_wrapper role installs them: the node package
    and its entry scripts (_lab.node_lib_files; the host side imports no Ansible)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _lab import node_lib_files

    return node_lib_files()


def guest_knobs():
    """The guest's knobs now, with node_prep's saved originals where a site.yml run (c) left its values: the
    defaults of a, r, g and k are the guest's own, also after an interrupted c."""
    saved = ssh("cat /var/lib/uma-vllm/sysctl-original.json 2>/dev/null || echo '{}'")
    originals = {k.split(".", 1)[1]: int(v) for k, v in json.loads(saved).items() if k.split(".", 1)[1] in KNOBS}
    return dict(_live_knobs(), **originals)


def _live_knobs():
    return json.loads(ssh("python3 -c 'import json; print(json.dumps({k: int(open(p).read()) for k, p in %s.items()}))'"
                          % json.dumps(KNOBS)))  # fmt: skip


def row(r):
    f = r["facts"]
    drv = f.get("driver", {})
    return "%-3s %-2d %-8s %-5s %7s %6s %9s %9s %7s %9s %5s %5s %5s" % (
        r["config"], r["index"], "healthy" if r["healthy"] else "FAILED", "yes" if r["completion"] else "no",
        r["healthy_s"] if r["healthy_s"] is not None else "-", r["cached_peak_mib"],
        (f.get("memavailable_at_check") or 0) >> 20 or "-", f.get("free_order9_at_kv", "-"),
        "%d/%d" % (drv.get("fallbacks_2m_to_64k", 0), drv.get("fallbacks_64k_to_4k", 0)) if drv else "-",
        "%d/%d" % (sum(v for k, v in r["vmstat"].items() if k.startswith("allocstall")), r["vmstat"]["compact_stall"]),
        r["vmstat"]["oom_kill"], drv.get("failures", "-") if drv else "-", r["exit"],
    )  # fmt: skip


def reserve_spark_kb():
    """node_prep's vm.min_free_kbytes for a 121 GiB Spark (the collection's own rule, imported)."""
    sys.path.insert(0, os.path.join(ROOT, "plugins", "module_utils"))
    from node.base import memavail  # host side only: the guest has no collection (the node package, stdlib only)

    return memavail.size_min_free_kbytes(SPARK_RAM)["min_free_kbytes"]


def console_tail(lines=60):
    cache = os.environ.get("UMA_VM_CACHE", os.path.join(ROOT, ".cache", "vm"))
    try:
        with open(os.path.join(cache, "console.log"), encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()[-lines:]
    except OSError:
        return []


def reboot_guest(args):
    subprocess.run(["bash", VM_SH, "down"], check=False, timeout=300)
    subprocess.run(["bash", VM_SH, "up"], check=True, timeout=900)
    setup(args)


def guest_answers(tries=6, wait_s=10.0, run=None):
    """True when a trivial command answers over ssh within ``tries`` attempts ``wait_s`` apart: before a
    launch, so that a guest the launch before left unreachable (an OOM kill, thrashing) is charged to that
    launch, not to the next configuration's."""
    run = run or (lambda: ssh("true", timeout=30))
    for attempt in range(tries):
        try:
            run()
            return True
        except (SystemExit, subprocess.TimeoutExpired):
            if attempt + 1 < tries:
                time.sleep(wait_s)
    return False


def launch_or_hang(args, cmd, config, index):
    """One launch; a guest that does not answer within --hang-s is a result too ("hung"), then rebooted."""
    try:
        return json.loads(ssh(cmd, timeout=args.hang_s).strip().splitlines()[-1])
    except (SystemExit, subprocess.TimeoutExpired) as err:
        console = console_tail()
        why = ("no answer within %d s" % args.hang_s if isinstance(err, subprocess.TimeoutExpired)
               else "the ssh session failed: %s" % str(err)[-160:])  # fmt: skip
        print("launch %s %d: %s; rebooting the guest" % (config, index, why), flush=True)
        reboot_guest(args)
        return {"config": config, "index": index, "healthy": False, "completion": False, "hung": True,
                "healthy_s": None, "exit": None, "cached_peak_mib": 0, "facts": {}, "guard": None,
                "errors": ["the guest did not answer: %s" % why], "kernel": [],
                "vmstat": {k: 0 for k in VMSTAT}, "console": console}  # fmt: skip


def ansible_playbook(root=None, which=shutil.which):
    """The ansible-playbook that c runs: the checkout's .venv's (tests/setup.sh --base makes it), else one on
    PATH. None of them: SystemExit naming both places and the fix, before anything is booted or launched
    (issue 35 item 6: it was a FileNotFoundError traceback after the guest's set-up)."""
    root = root or ROOT
    mine = os.path.join(root, ".venv", "bin", "ansible-playbook")
    if os.path.isfile(mine) and os.access(mine, os.X_OK):
        return mine
    found = which("ansible-playbook")
    if found:
        return found
    raise SystemExit(
        "uma_vm.py: --configs c runs site.yml with ansible-playbook, which is neither in this checkout's"
        " .venv (%s) nor on PATH. Fix: run 'bash tests/setup.sh --base' in the checkout (it makes .venv and"
        " links the collection), or put ansible-core >= 2.17 on PATH." % mine
    )


def vm_playbook(playbook, extra_vars):
    """ansible-playbook PLAYBOOK (relative to the checkout) on inventories/vm: the result and its recap line."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.environ.get("ANSIBLE_CONFIG", os.path.join(ROOT, "ansible.cfg")))
    cmd = [ansible_playbook(), os.path.join(ROOT, playbook), "-i", os.path.join(ROOT, "inventories", "vm"),
           "-e", json.dumps(extra_vars)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=1800)
    return res, [ln for ln in res.stdout.splitlines() if ln.startswith("uma-vm ")][-1:]


def site_yml(args, reserve):
    """c: site.yml on inventories/vm (node_prep, launch_wrapper, vllm_service: the planner sizes the KV cache),
    once; the engine it started is stopped again, so that every measured launch is a cold one."""
    weights = json.loads(ssh("python3 /root/uma_loader.py /srv/model --as-rank %d:%d --allocator %s --rank-bytes" % (
        args.tp, args.rank, args.allocator)))["weight_driver_bytes"]  # fmt: skip
    memtotal_kb = int(ssh("awk '/^MemTotal:/ {print $2}' /proc/meminfo"))
    min_free = reserve * memtotal_kb // (SPARK_RAM // 1024)  # as r and k: the Spark's rule scaled to the guest
    t0 = time.monotonic()
    res, recap = vm_playbook("site.yml", {"uma_vm_weights_bytes": weights, "uma_min_free_kbytes": min_free})
    took = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit("uma_vm.py: site.yml on inventories/vm failed (%d):\n%s" % (
            res.returncode, "\n".join(res.stdout.splitlines()[-40:])))  # fmt: skip
    plan = json.loads(ssh("cat /etc/uma-vllm/engines/vm.json"))["plan"]
    ssh("systemctl stop %s" % SiteLaunch.UNIT)
    knobs = _live_knobs()
    site = {"seconds": round(took, 1), "recap": recap, "weights_bytes": weights, "min_free_kbytes": min_free,
            "knobs": knobs}  # fmt: skip
    site.update({k: plan.get(k) for k in ("kv_cache_bytes", "gpu_memory_utilization", "reserve_bytes",
                                          "reserve_source", "requested_memory_bytes")})  # fmt: skip
    said = recap[-1].split(":", 1)[1].strip() if recap else "no recap"
    print("site.yml on the guest: %.0f s, %s; the plan: KV %d bytes (%.0f MiB), --gpu-memory-utilization %s, reserve"
          " %s bytes; node_prep's knobs %s" % (took, said, site["kv_cache_bytes"], site["kv_cache_bytes"] / 2**20,
                                               site["gpu_memory_utilization"], site["reserve_bytes"], knobs),
          flush=True)  # fmt: skip
    return site


def site_restore(site):
    """After c: playbooks/restore.yml puts the guest back as it was (the engine, its watchdog, the launcher and
    node_prep's sysctls gone, the boot values back), so that later a/r/g/k runs on this disk image see no
    engine starting at boot."""
    res, recap = vm_playbook(
        os.path.join("playbooks", "restore.yml"), {"uma_vm_weights_bytes": site.get("weights_bytes") or 1}
    )
    left = ssh("ls /etc/systemd/system | grep -c uma-vllm || true; cat /proc/sys/vm/min_free_kbytes").split()
    out = {"rc": res.returncode, "recap": recap, "units_left": left[0] if left else None,
           "min_free_kbytes_after": left[1] if len(left) > 1 else None}  # fmt: skip
    print("restore.yml on the guest: %s" % json.dumps(out), flush=True)
    return out


def host(args):
    if "c" in args.configs.split(","):
        ansible_playbook()  # refused here, before the guest is set up, not after
    defaults = setup(args)
    reserve = int(reserve_spark_kb() * args.reserve_scale)
    print("guest defaults: %s; node_prep's reserve for a 121 GiB Spark%s: %d kB" % (
        defaults, " x %g" % args.reserve_scale if args.reserve_scale != 1 else "", reserve), flush=True)  # fmt: skip
    site = {"weights_bytes": None} if "c" in args.configs.split(",") else None
    results = []
    try:
        if site is not None:
            site = site_yml(args, reserve)
        for i in range(args.launches):
            for config in args.configs.split(","):
                cmd = "python3 /root/uma_vm.py --guest %s --index %d --defaults '%s' " % (
                    config,
                    i + 1,
                    json.dumps(defaults),
                )
                cmd += "--tp %d --rank %d --gmu %s --kv %s --allocator %s --timeout %d --reserve-spark-kb %d" % (
                    args.tp, args.rank, args.gmu, args.kv, args.allocator, args.timeout, reserve)  # fmt: skip
                if args.guard_lock_memory:
                    cmd += " --guard-lock-memory"
                if args.hold:
                    cmd += " --hold %s" % args.hold
                cmd += " --admission-wait %g" % args.admission_wait
                if config == "c":
                    cmd += " --site-knobs '%s'" % json.dumps(site["knobs"])
                if args.hang_s and results and not guest_answers():
                    # the launch before left the guest unreachable after its result came back
                    results[-1]["left_unreachable"] = True
                    print("launch %s %d left the guest unreachable (no ssh answer for 60 s); rebooting it" % (
                        results[-1]["config"], results[-1]["index"]), flush=True)  # fmt: skip
                    reboot_guest(args)
                if args.hang_s:
                    results.append(launch_or_hang(args, cmd, config, i + 1))
                else:
                    results.append(json.loads(ssh(cmd).strip().splitlines()[-1]))
                print("launch %s: %s" % (config, json.dumps(results[-1])), flush=True)
                if args.json:  # after every launch: an interrupted experiment keeps what it measured
                    with open(args.json, "w", encoding="utf-8") as fh:
                        json.dump(
                            {"defaults": defaults, "reserve_spark_kb": reserve, "site": site, "launches": results}, fh
                        )
    finally:
        if site is not None:
            site["restore"] = site_restore(site)
        try:
            restore = "python3 -c 'import json; [open(p, \"w\").write(str(v)) for p, v in zip(%s, %s)]'" % (
                json.dumps(list(KNOBS.values())), json.dumps([defaults[k] for k in KNOBS]))  # fmt: skip
            ssh(restore, timeout=120)
        except (SystemExit, subprocess.TimeoutExpired) as err:  # a hung guest: `lab/vm.sh down` resets it anyway
            print("uma_vm.py: the guest's knobs were not restored: %s" % err, flush=True)
    print("\nconfig # result   compl healthy cache  MemAvail  order9   fallbk  stall/cmp  oom  fail  exit")
    print("                         s      MiB   MiB@chk  @KValloc 2M/64K")
    for r in results:
        print(row(r))
    for config in args.configs.split(","):
        rs = [r for r in results if r["config"] == config]
        times = [r["healthy_s"] for r in rs if r["healthy_s"] is not None]
        print("%s: %d/%d healthy; time to healthy median %s min %s max %s s" % (
            config, len(times), len(rs), statistics.median(times) if times else "-", min(times, default="-"),
            max(times, default="-")))  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"defaults": defaults, "reserve_spark_kb": reserve, "site": site, "launches": results}, fh,
                      indent=1)  # fmt: skip
    return 0


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(value, spec="%.1f"):
    return "-" if value is None else spec % value


def report(path):
    """One markdown row per configuration from a --json file: medians (min-max) of every launch."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    launches = data["launches"]
    configs = []
    for r in launches:
        if r["config"] not in configs:
            configs.append(r["config"])
    print(
        "| config | healthy | completion | time to healthy s: median (min-max) | load s | KV alloc s: median (max)"
        " | page-cache peak MiB | MemAvailable at check MiB | free order-9 before KV | fallbacks 2M->64K / 64K->4K"
        " | failures | allocstall / compact_stall (median; max) | oom_kill | guard CPU s / evicted MiB |"
    )
    print("|---" * 14 + "|")
    for config in configs:
        rs = [r for r in launches if r["config"] == config]
        facts = [r["facts"] for r in rs]
        times = [r["healthy_s"] for r in rs if r["healthy_s"] is not None]
        hung = sum(1 for r in rs if r.get("hung"))
        broke = sum(1 for r in rs if r.get("left_unreachable"))
        kv = [f.get("kv_alloc_s") for f in facts]
        stalls = [sum(v for k, v in r["vmstat"].items() if k.startswith("allocstall")) for r in rs]
        compact = [r["vmstat"]["compact_stall"] for r in rs]
        drv = [f.get("driver") or {} for f in facts]
        guard = [r.get("guard") or {} for r in rs]
        row_fmt = "| %s | %d/%d | %d/%d | %s (%s-%s) | %s | %s (%s) | %s | %s | %s | %d / %d | %d"
        row_fmt += " | %s / %s (%s; %s) | %d | %s |"
        print(row_fmt % (
            config + (" (%d hung)" % hung if hung else "") + (" (%d left it unreachable)" % broke if broke else ""),
            len(times), len(rs),
            sum(1 for r in rs if r["completion"]), len(rs), _fmt(_median(times)),
            _fmt(min(times, default=None)), _fmt(max(times, default=None)),
            _fmt(_median([f.get("load_s") for f in facts])), _fmt(_median(kv)),
            _fmt(max((v for v in kv if v is not None), default=None)),
            _fmt(_median([r["cached_peak_mib"] for r in rs]), "%.0f"),
            _fmt(_median([(f.get("memavailable_at_check") or 0) >> 20 or None for f in facts]), "%.0f"),
            _fmt(_median([f.get("free_order9_at_kv") for f in facts]), "%.0f"),
            sum(d.get("fallbacks_2m_to_64k", 0) for d in drv), sum(d.get("fallbacks_64k_to_4k", 0) for d in drv),
            sum(d.get("failures", 0) for d in drv), _fmt(_median(stalls), "%.0f"), _fmt(_median(compact), "%.0f"),
            max(stalls, default=0), max(compact, default=0), sum(r["vmstat"]["oom_kill"] for r in rs),
            "%s / %s" % (_fmt(_median([g.get("cpu_seconds") for g in guard])), _fmt(_median(
                [(g.get("evicted_bytes") or 0) / 2**20 if g else None for g in guard]), "%.0f")) if any(guard) else
            "%s (the prefetch's CPU s)" % _fmt(_median([(r.get("prefetch") or {}).get("cpu_s") for r in rs]), "%.2f")
            if any(r.get("prefetch") for r in rs) else "-",
        ))  # fmt: skip
    site_report(data)
    admission_report(launches)
    return 0


def admission_report(launches):
    """d (and any --hold run): what the launcher's admission did and what the second process held."""
    for config in sorted({r["config"] for r in launches if r.get("hold") or r["config"] == "d"}):
        rs = [r for r in launches if r["config"] == config]
        adm = [(r.get("launcher") or {}).get("admission") or {} for r in rs]
        hold = [r.get("hold") or {} for r in rs]
        waited = [a.get("waited_s") for a in adm if a]
        print("%s: admitted %d, refused %d of %d (exit 75: %d); waited s median %s (max %s); the engine's own check"
              " failed %d; held MiB %s for %s s, MemAvailable with it MiB median %s" % (
                  config, sum(1 for a in adm if a.get("admitted")), sum(1 for a in adm if a and not a.get("admitted")),
                  len(rs), sum(1 for r in rs if r["exit"] == 75), _fmt(_median(waited)),
                  _fmt(max(waited, default=None)),
                  sum(1 for r in rs if any("less than desired" in e for e in r["errors"])),
                  _fmt(_median([h.get("mib") for h in hold]), "%.0f"), _fmt(_median([h.get("s") for h in hold])),
                  _fmt(_median([h.get("memavailable_with_hold_mib") for h in hold]), "%.0f")))  # fmt: skip


def site_report(data):
    """c: what site.yml planned, and what the launcher and the engine's watchdog did in each launch."""
    site = data.get("site")
    cs = [r for r in data["launches"] if r["config"] == "c"]
    if not site or not cs:
        return
    print("\nsite.yml: %s s, %s; plan: KV %s bytes (%.0f MiB), --gpu-memory-utilization %s, reserve %s bytes"
          " (%s); node_prep's knobs %s; restore.yml: %s" % (
              site.get("seconds"), " ".join(site.get("recap") or []), site.get("kv_cache_bytes"),
              (site.get("kv_cache_bytes") or 0) / 2**20, site.get("gpu_memory_utilization"), site.get("reserve_bytes"),
              site.get("reserve_source"), site.get("knobs"), site.get("restore")))  # fmt: skip
    launcher = [r.get("launcher") or {} for r in cs]
    dog = [x.get("watchdog") or {} for x in launcher]
    adm = [x.get("admission") or {} for x in launcher]
    guard = [r.get("guard") or {} for r in cs]
    avail = _median([(a.get("mem_available_bytes") or 0) >> 20 or None for a in adm])
    need = _median([(a.get("need_bytes") or 0) >> 20 or None for a in adm])
    faults = [g.get("major_faults") for g in guard]
    rows = [
        ("the launcher saw /health 200 (its record's healthy_at)", sum(1 for x in launcher if x.get("healthy_at"))),
        ("admitted by the launcher (MemAvailable >= the plan's request)", sum(1 for a in adm if a.get("admitted"))),
        ("watchdog restarts", sum(d.get("restart", 0) for d in dog)),
        ("watchdog floor-while-starting notes", sum(d.get("floor-while-starting", 0) for d in dog)),
        ("watchdog evictions (warning floor)", sum(d.get("evict", 0) for d in dog)),
        ("watchdog gave up", sum(d.get("gave_up", 0) for d in dog)),
    ]
    print("| c: through the collection | value |")
    print("|---|---|")
    for name, count in rows:
        print("| %s | %d of %d |" % (name, count, len(cs)))
    print("| MemAvailable at admission MiB, median / the plan's request MiB | %s / %s |" % (
        _fmt(avail, "%.0f"), _fmt(need, "%.0f")))  # fmt: skip
    print("| guard locked KiB, median / guard major faults, median (max) | %s / %s (%s) |" % (
        _fmt(_median([g.get("locked_kib") for g in guard]), "%.0f"), _fmt(_median(faults), "%.0f"),
        max((f or 0 for f in faults), default=0)))  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=3, help="launches per configuration (3: a trial)")
    p.add_argument("--configs", default="a,b", help="configurations, interleaved (a,b; of %s)" % ",".join(CONFIGS))
    p.add_argument("--tp", type=int, default=2, help="--tensor-parallel-size of the rank (2)")
    p.add_argument("--rank", type=int, default=0, help="--rank (0)")
    p.add_argument("--gmu", default="0.8", help="--gpu-memory-utilization (0.8)")
    p.add_argument("--kv", default="512M", help="--kv-cache-memory-bytes (512M)")
    p.add_argument("--allocator", default="exact", help="the loader's --allocator (exact)")
    p.add_argument("--reserve-scale", type=float, default=1.0, metavar="X",
                   help="r and k use node_prep's reserve times X (1: the rule as shipped; 0.5: half)")  # fmt: skip
    p.add_argument("--guard-lock-memory", action="store_true",
                   help="g and k: the guard with --lock-memory (its own pages locked: mlockall ONFAULT)")  # fmt: skip
    p.add_argument("--hold", default="", metavar="MIB:S",
                   help="before each launch a second process takes MIB of fakegb10 memory and lets it go S s later"
                        " (a stopping engine's memory)")  # fmt: skip
    p.add_argument("--admission-wait", type=float, default=60.0, metavar="S",
                   help="d: the launcher's admission_wait_s (60, its default)")  # fmt: skip
    p.add_argument("--timeout", type=int, default=400, help="seconds a launch may take to become healthy (400)")
    p.add_argument("--json", default="", help="also write the launches to this file")
    p.add_argument("--hang-s", type=int, default=0, metavar="S",
                   help="a launch whose guest does not answer within S s is recorded as hung, then the guest"
                        " is rebooted (0: off, the ssh waits up to 900 s and a failure ends the run); before each"
                        " launch the guest must answer a trivial ssh command within 60 s, else the launch before"
                        " is recorded as having left it unreachable and the guest is rebooted")  # fmt: skip
    p.add_argument("--report", default="", metavar="JSON", help="print the per-configuration table of a --json file")
    p.add_argument("--guest", choices=CONFIGS, help=argparse.SUPPRESS)
    p.add_argument("--reserve-spark-kb", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--defaults", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=8000, help=argparse.SUPPRESS)
    p.add_argument("--site-knobs", default="", help=argparse.SUPPRESS)
    p.add_argument("--hold-guest", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.hold_guest:
        return hold_guest(args.hold_guest)
    if args.hang_s < 0 or (args.hang_s and args.hang_s <= args.timeout):
        p.error("--hang-s must be 0 (off) or longer than --timeout (%d s, the guest's own bound); got %d" % (
            args.timeout, args.hang_s))  # fmt: skip
    if args.launches < 1 or not set(args.configs.split(",")) <= set(CONFIGS):
        p.error("--launches must be >= 1 and --configs a list of %s; got %r, %r" % (
            ", ".join(CONFIGS), args.launches, args.configs))  # fmt: skip
    if not 0 < args.reserve_scale <= 3:
        p.error("--reserve-scale must be above 0 and at most 3 (a multiple of node_prep's reserve); got %g" % (
            args.reserve_scale))  # fmt: skip
    if args.hold:
        try:
            mib, seconds = parse_hold(args.hold)
        except ValueError:
            mib, seconds = 0, -1.0
        if mib < 1 or not 0 <= seconds <= 3600:
            p.error("--hold must be MIB:S (whole MiB >= 1, 0-3600 s), e.g. 600:10; got %r" % args.hold)
    if not 0 <= args.admission_wait <= 3600:
        p.error("--admission-wait must be 0-3600 s; got %g" % args.admission_wait)
    if args.report:
        return report(args.report)
    return guest_launch(args) if args.guest else host(args)


if __name__ == "__main__":
    sys.exit(main())
