# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Capture one UMA loader launch in the VM guest as raw files (issue 20 item 6).

Runs in the guest (stdlib only), after ``insmod fakegb10.ko`` (a STAND-IN for the GB10
driver) and with /root/uma_loader.py present. It drops the caches, starts the loader (a
stand-in for vLLM on a GB10 rank), waits until /health answers 200 or the loader exits,
and writes, verbatim, into OUTDIR:

  journal.txt                   ``journalctl -u uma-vllm@uma-vm -o short-iso``: the loader runs as that
                                transient systemd unit (``systemd-run``), as the launcher's engine would
  loader.log                    the same lines without the journal's prefix (``-o cat``)
  kernel-journal.txt            ``journalctl -k -b -o short-iso`` (what oom_diagnose reads first)
  dmesg.txt                     ``dmesg`` after the launch (plain, seconds since boot)
  vmstat.before / vmstat.after  /proc/vmstat
  meminfo.before / meminfo.after, buddyinfo.before / buddyinfo.after
  stat.txt                      /proc/stat (``btime`` places dmesg's lines in time)
  fakegb10.txt                  the stand-in driver's counters (/sys/class/misc/fakegb10/*)
  result.json                   exit code, healthy, seconds, the command line, uname -r

``--hog-mib N`` also starts a second process that touches N MiB of anonymous memory once
the loader logged ``--hog-after`` (a second process's memory during the load).

  python3 capture_launch.py /root/cap/vm-kv-960m --kv 960M
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

HOG = (
    "import sys, time\nb = bytearray(int(sys.argv[1]) << 20)\n"
    "for i in range(0, len(b), 4096):\n    b[i] = 1\ntime.sleep(600)\n"
)


def copy(src, dst):
    with open(src, encoding="ascii") as fh, open(dst, "w", encoding="ascii") as out:
        out.write(fh.read())


def snapshot(outdir, suffix):
    for name in ("vmstat", "meminfo", "buddyinfo"):
        copy("/proc/" + name, os.path.join(outdir, "%s.%s" % (name, suffix)))


UNIT = ["uma-vllm@uma-vm.service"]  # [0]: the unit in use


def out_of(argv):
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def show(prop):
    return out_of(["systemctl", "show", "-p", prop, "--value", UNIT[0]]).strip()


def running():
    return show("ActiveState") in ("active", "activating", "reloading")


def unit_status():
    return {k: show(k) for k in ("ActiveState", "Result", "ExecMainCode", "ExecMainStatus")}


def start_unit(cmd):
    """The loader as the transient unit uma-vllm@uma-vm (uma-vllm-uma-vm if an instance name is refused)."""
    for unit in (UNIT[0], UNIT[0].replace("@", "-")):
        UNIT[0] = unit
        subprocess.run(["systemctl", "reset-failed", unit], capture_output=True, check=False)
        argv = ["systemd-run", "--unit", unit, "--property", "KillMode=mixed", "--", *cmd]
        if subprocess.run(argv, check=False).returncode == 0:
            return
    raise SystemExit("capture_launch.py: systemd-run failed")


def hog_due(args):
    return args.hog_after in out_of(["journalctl", "-u", UNIT[0], "-o", "cat", "--no-pager"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir")
    p.add_argument("--kv", required=True, help="--kv-cache-memory-bytes")
    p.add_argument("--gmu", default="0.8")
    p.add_argument("--hog-mib", type=int, default=0)
    p.add_argument("--hog-after", default="model init:", help="start the hog once the loader logged this")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as fh:
        fh.write("3")
    snapshot(args.outdir, "before")
    cmd = [sys.executable, "/root/uma_loader.py", "/srv/model", "--tensor-parallel-size", "2", "--rank", "0",
           "--gpu-memory-utilization", args.gmu, "--kv-cache-memory-bytes", args.kv, "--port", "8000",
           "--host", "127.0.0.1", "--allocator", "exact"]  # fmt: skip
    started = time.time()
    start_unit(cmd)
    hog = None
    healthy_s = None
    while time.time() - started < args.timeout and running():
        if args.hog_mib and hog is None and hog_due(args):
            hog = subprocess.Popen([sys.executable, "-c", HOG, str(args.hog_mib)])
        try:
            with urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=1) as resp:
                if resp.status == 200:
                    healthy_s = time.time() - started
                    break
        except OSError:
            time.sleep(0.25)
    snapshot(args.outdir, "after")
    rc = unit_status()
    subprocess.run(["systemctl", "stop", UNIT[0]], capture_output=True, check=False)
    unit = UNIT[0]
    for name, what in (("journal.txt", ["-u", unit, "-o", "short-iso"]), ("loader.log", ["-u", unit, "-o", "cat"]),
                       ("kernel-journal.txt", ["-k", "-b", "-o", "short-iso"])):  # fmt: skip
        with open(os.path.join(args.outdir, name), "w", encoding="utf-8") as fh:
            fh.write(out_of(["journalctl", "--no-pager", *what]))
    hog_rc = None
    if hog is not None:
        if hog.poll() is None:
            hog.kill()
        hog_rc = hog.wait()
    with open(os.path.join(args.outdir, "dmesg.txt"), "w", encoding="utf-8") as fh:
        fh.write(out_of(["dmesg"]))
    copy("/proc/stat", os.path.join(args.outdir, "stat.txt"))
    counters = []
    base = "/sys/class/misc/fakegb10"
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, name)
        if os.path.isfile(path) and name not in ("uevent", "dev"):
            with open(path, encoding="ascii") as fh:
                counters.append("%s: %s" % (name, fh.read().strip()))
    with open(os.path.join(args.outdir, "fakegb10.txt"), "w", encoding="ascii") as fh:
        fh.write("\n".join(counters) + "\n")
    result = {"command": cmd, "exit": rc, "healthy": healthy_s is not None,
              "healthy_s": round(healthy_s, 1) if healthy_s is not None else None,
              "started_unix": round(started, 3), "ended_unix": round(time.time(), 3),
              "hog_mib": args.hog_mib, "hog_exit": hog_rc, "uname_r": os.uname().release,
              "python": shutil.which("python3")}  # fmt: skip
    with open(os.path.join(args.outdir, "result.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
