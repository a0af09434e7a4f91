# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wall time of site.yml against N lab nodes: the first run and the no-op re-run.

For each N in ``--nodes`` it starts N systemd containers from the lab image
(``uma-scale-1`` ... ``uma-scale-N``), writes an inventory shaped like
``inventories/lab`` (group ``spark``, per-host RAM and reserve) in a temp dir,
runs ``site.yml`` twice and prints the wall time and the PLAY RECAP's changed
count of each run, then removes the containers after ``restore.yml``.

The nodes only persist their sysctl file (``node_prep_sysctl_apply: false``:
the lab nodes share this machine's kernel) and run no engine
(``vllm_service_engines: []``): what scales with N is Ansible's own work
(facts, module transfers, file comparisons), which is what a no-op re-run
costs on a real cluster. ``--engines`` adds the lab's tiny real engine per node
(needs ``.cache/lab/vllm-venv`` and the tiny-1g model: ``bash lab/up.sh`` makes both).

    sudo .venv/bin/python benchmarks/site_scale.py --nodes 2 8 [--forks 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from _lab import docker, start_node, wait_systemd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def start(names: list, image: str, engines: bool) -> None:
    for name in names:
        mounts = []
        if engines:
            lab = os.path.join(ROOT, ".cache", "lab")
            mounts = ["-v", "%s/vllm-venv:/opt/vllm:ro" % lab, "-v", "%s/models:/models:ro" % lab]
        start_node(name, image, mounts)
    for name in names:
        wait_systemd(name)


def inventory(work: str, names: list, engines: bool) -> str:
    path = os.path.join(work, "hosts.yml")
    lines = ["all:", "  children:", "    spark:", "      hosts:"]
    for name in names:
        lines.append("        %s: {uma_ram_gib: 23, uma_min_free_kbytes: 262144, uma_net_interface: eth0}" % name)
    lines += [
        "  vars:",
        "    ansible_connection: community.docker.docker",
        "    ansible_python_interpreter: /usr/bin/python3",
        "    node_prep_require_unified_memory: false",
        "    node_prep_sysctl_apply: false",
        "    uma_reserve_gib: 4",
    ]
    if not engines:
        lines.append("    vllm_service_engines: []")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    if engines:  # the lab's engine definitions (the tiny real engine; TP engines installed, stopped)
        os.makedirs(os.path.join(work, "group_vars"), exist_ok=True)
        with open(os.path.join(ROOT, "inventories", "lab", "group_vars", "spark.yml"), encoding="utf-8") as src:
            text = src.read().replace("node_prep_require_unified_memory: false\n", "")
        with open(os.path.join(work, "group_vars", "spark.yml"), "w", encoding="utf-8") as dst:
            dst.write(text)
    return path


def playbook(inv: str, book: str, forks: int) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORKS=str(forks))
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".cache", "collections")
    env["PATH"] = os.path.join(ROOT, ".venv", "bin") + os.pathsep + env.get("PATH", "")
    started = time.monotonic()
    proc = subprocess.run(
        ["ansible-playbook", "-i", inv, book], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - started
    recap = {m.group(1): {"changed": int(m.group(3)), "failed": int(m.group(5)) + int(m.group(4))}
             for m in RECAP.finditer(proc.stdout)}  # fmt: skip
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
    return {
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "changed": sum(h["changed"] for h in recap.values()),
        "failed": sum(h["failed"] for h in recap.values()),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    p.add_argument("--forks", type=int, default=10)
    p.add_argument("--image", default="uma-lab/node:bookworm")
    p.add_argument("--engines", action="store_true", help="one real tiny engine per node")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if os.geteuid() != 0:
        p.error("needs root (docker)")
    if any(n < 1 or n > 32 for n in a.nodes):
        p.error("--nodes: give 1 to 32 nodes per run, e.g. --nodes 2 8")
    results = []
    for count in a.nodes:
        names = ["uma-scale-%d" % (i + 1) for i in range(count)]
        with tempfile.TemporaryDirectory(prefix="uma-scale-") as work:
            try:
                start(names, a.image, a.engines)
                inv = inventory(work, names, a.engines)
                first = playbook(inv, "site.yml", a.forks)
                rerun = playbook(inv, "site.yml", a.forks)
                playbook(inv, "playbooks/restore.yml", a.forks)
            finally:
                for name in names:
                    docker("rm", "-f", name, check=False)
        row = {"nodes": count, "first": first, "rerun": rerun}
        results.append(row)
        if not a.json:
            sys.stderr.write("%d nodes: first %s, re-run %s\n" % (count, first, rerun))
    out = {
        "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release, "load": os.getloadavg()},
        "forks": a.forks,
        "engines": a.engines,
        "results": results,
    }
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print("| nodes | first run s | changed | no-op re-run s | changed | failed |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in results:
            f, n = r["first"], r["rerun"]
            cells = (r["nodes"], f["wall_s"], f["changed"], n["wall_s"], n["changed"], f["failed"] + n["failed"])
            print("| %d | %s | %d | %s | %d | %d |" % cells)
        print("forks %d, %d CPUs, load %s" % (a.forks, os.cpu_count(), " ".join("%.1f" % x for x in os.getloadavg())))
    return 0 if all(r["first"]["rc"] == 0 and r["rerun"]["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
