# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wall time of site.yml against N lab nodes: the first run and the no-op re-run, for one or
more checkouts of the collection (before/after a change), interleaved on the same nodes.

For each N in ``--nodes`` it starts N systemd containers from the lab image
(``uma-scale-1`` ... ``uma-scale-N``), writes an inventory shaped like
``inventories/lab`` (group ``spark``, per-host RAM and reserve) in a temp dir, runs
``site.yml`` of the first ``--tree`` once (the first run), then the no-op re-run of every tree
in turn, ``--repeat`` rounds (tree A, tree B, tree A, ...), and prints the wall time and the
PLAY RECAP's changed count of each; the medians go in the table. With two or more trees each
turn starts with one unmeasured run of that tree (it puts back the files the other tree wrote
differently; its changed count is printed as "switch"). Then ``restore.yml`` and the
containers are removed.

The nodes only persist their sysctl file (``node_prep_sysctl_apply: false``:
the lab nodes share this machine's kernel) and run no engine
(``vllm_service_engines: []``): what scales with N is Ansible's own work
(facts, module transfers, file comparisons), which is what a no-op re-run
costs on a real cluster. ``--engines`` adds the lab's tiny real engine per node
(needs ``.cache/lab/vllm-venv`` and the tiny-1g model: ``bash lab/up.sh`` makes both).
``--lab`` instead runs against the running two-node lab of ``bash lab/up.sh``
(``inventories/lab``: real engines, a TP=2 engine over both nodes) and leaves it running.

A tree is a checkout with its ``.cache/collections`` link (``tests/setup.sh`` makes it; for an
old commit: ``git worktree add /tmp/before <rev>`` and link it the same way).

    sudo .venv/bin/python benchmarks/site_scale.py --nodes 2 8 [--forks 10] [--repeat 3] \
        [--tree before=/tmp/before --tree after=.] [--json]
    sudo .venv/bin/python benchmarks/site_scale.py --lab --tree before=/tmp/before --tree after=.
    sudo .venv/bin/python benchmarks/site_scale.py --lab -e @lab/runtime-container.yml --tree ...
        (the lab of lab/up.sh --runtime container)

``-e`` (repeatable) goes to every ansible-playbook run as ``--extra-vars``; a relative ``@file`` is
read in each tree (each run's working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
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


EXTRA_VARS: list = []


def playbook(tree: str, inv: str, book: str, forks: int) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(tree, "ansible.cfg"), ANSIBLE_FORKS=str(forks))
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(tree, ".cache", "collections")
    env["PATH"] = os.path.join(ROOT, ".venv", "bin") + os.pathsep + env.get("PATH", "")
    started = time.monotonic()
    proc = subprocess.run(
        ["ansible-playbook", "-i", inv, book, *[w for e in EXTRA_VARS for w in ("-e", e)]],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
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


def trees(specs: list, parser: argparse.ArgumentParser) -> list:
    """``NAME=PATH`` pairs -> [(name, absolute path)]; each must be a checkout with its collection link."""
    out = []
    for spec in specs or ["this=" + ROOT]:
        name, sep, path = spec.partition("=")
        path = os.path.abspath(path)
        if not sep or not name:
            parser.error("--tree %s: give NAME=PATH, e.g. --tree before=/tmp/before" % spec)
        link = os.path.join(path, ".cache", "collections", "ansible_collections", "uma", "vllm")
        if not os.path.isfile(os.path.join(path, "site.yml")) or not os.path.isdir(link):
            parser.error("--tree %s: %s needs site.yml and %s (run tests/setup.sh there)" % (spec, path, link))
        out.append((name, path))
    return out


def measure(names: list, inv: str, a: argparse.Namespace, tree_list: list, restore: bool) -> dict:
    """First run of the first tree, then ``--repeat`` rounds of every tree's no-op re-run. With
    more than one tree, each turn starts with an unmeasured run that puts the tree's own files
    back (two releases may ship different files); its changed count is kept as ``switch``."""
    first = playbook(tree_list[0][1], inv, "site.yml", a.forks)
    runs: dict = {name: [] for name, _path in tree_list}
    switch: dict = {name: [] for name, _path in tree_list}
    for _round in range(a.repeat):
        for name, path in tree_list:
            if len(tree_list) > 1:
                switch[name].append(playbook(path, inv, "site.yml", a.forks)["changed"])
            runs[name].append(playbook(path, inv, "site.yml", a.forks))
            sys.stderr.write("%d nodes, %s: %s\n" % (len(names), name, runs[name][-1]))
    if restore:
        playbook(tree_list[0][1], inv, "playbooks/restore.yml", a.forks)
    return {"nodes": len(names), "first": first, "reruns": runs, "switch": switch}


def table(results: list, tree_list: list) -> None:
    print(
        "| nodes | tree | first run s (changed) | no-op re-run s, median | runs s | changed per run | switch | failed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        for i, (name, _path) in enumerate(tree_list):
            runs = r["reruns"][name]
            first = "%s (%d)" % (r["first"]["wall_s"], r["first"]["changed"]) if i == 0 else "-"
            failed = sum(x["failed"] + (x["rc"] != 0) for x in runs) + (r["first"]["failed"] if i == 0 else 0)
            walls = " ".join(str(x["wall_s"]) for x in runs)
            changed = " ".join(str(x["changed"]) for x in runs)
            switch = " ".join(str(x) for x in r["switch"][name]) or "-"
            median = statistics.median(x["wall_s"] for x in runs)
            print(
                "| %s | %s | %s | %.1f | %s | %s | %s | %d |"
                % (r["nodes"], name, first, median, walls, changed, switch, failed)
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    p.add_argument("--forks", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3, help="rounds of no-op re-runs (every tree once per round)")
    p.add_argument("--tree", action="append", help="NAME=PATH of a checkout to run site.yml from (repeatable)")
    p.add_argument("--image", default="uma-lab/node:bookworm")
    p.add_argument("--engines", action="store_true", help="one real tiny engine per node")
    p.add_argument("--lab", action="store_true", help="the running lab of lab/up.sh (inventories/lab), left running")
    p.add_argument("--json", action="store_true")
    p.add_argument("-e", "--extra-vars", action="append", default=[], help="to every ansible-playbook run (repeatable)")
    a = p.parse_args()
    EXTRA_VARS.extend(a.extra_vars)
    if os.geteuid() != 0:
        p.error("needs root (docker)")
    if any(n < 1 or n > 32 for n in a.nodes):
        p.error("--nodes: give 1 to 32 nodes per run, e.g. --nodes 2 8")
    if not 1 <= a.repeat <= 20:
        p.error("--repeat: give 1 to 20 rounds")
    tree_list = trees(a.tree, p)
    results = []
    if a.lab:
        for node in ("ai1", "ai2"):
            if docker("inspect", "-f", "{{.State.Running}}", node, check=False).strip() != "true":
                p.error("--lab: %s is not running; start the lab with: bash lab/up.sh" % node)
        results.append(measure(["ai1", "ai2"], os.path.join(ROOT, "inventories", "lab"), a, tree_list, False))
    for count in [] if a.lab else a.nodes:
        names = ["uma-scale-%d" % (i + 1) for i in range(count)]
        with tempfile.TemporaryDirectory(prefix="uma-scale-") as work:
            try:
                start(names, a.image, a.engines)
                results.append(measure(names, inventory(work, names, a.engines), a, tree_list, True))
            finally:
                for name in names:
                    docker("rm", "-f", name, check=False)
    out = {
        "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release, "load": os.getloadavg()},
        "forks": a.forks,
        "engines": "lab" if a.lab else a.engines,
        "trees": dict(tree_list),
        "results": results,
    }
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        table(results, tree_list)
        print("forks %d, %d CPUs, load %s" % (a.forks, os.cpu_count(), " ".join("%.1f" % x for x in os.getloadavg())))
    runs = [r["first"] for r in results] + [x for r in results for v in r["reruns"].values() for x in v]
    return 0 if all(x["rc"] == 0 for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
