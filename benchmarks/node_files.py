# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wall time of a no-op re-run: one uma.vllm.node_files task against one task per file.

Both plays make the same node state under a temporary directory with the local connection
(no containers, no lab lock): the directories, files and secret file of one engine and the
22 node programs, the way launch_wrapper and vllm_service write them today (ansible.builtin
file / copy in loops, the programs copied from plugins/module_utils/) or in one node_files
task (``programs: true``). After a first converging run of each, ``--runs`` no-op re-runs
alternate between the two (interleaved, so load drifts hit both) and the medians are printed
with the machine. Every re-run must report changed=0 (checked; otherwise the numbers are not
printed).

The local connection is the cheapest per task; over the docker connection of the lab or SSH
every task also pays a round trip, so the difference per task saved is larger there.

    .venv/bin/python benchmarks/node_files.py [--runs 7] [--json]
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
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".cache", "collections"))
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.node_install import package_dirs, program_names

RECAP = re.compile(r"^localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def node_set(base: str) -> dict:
    etc = os.path.join(base, "etc")
    engines = os.path.join(etc, "engines")
    units = os.path.join(base, "units", "uma-vllm@tiny.service.d")
    config = json.dumps({"engine": "tiny", "model": "/models/tiny", "port": 8000, "args": ["--x"] * 40}, indent=2)
    return {
        "directories": [
            {"path": etc},
            {"path": engines, "mode": "0750"},
            {"path": os.path.dirname(units)},
            {"path": units},
        ],
        "files": [
            {"path": os.path.join(etc, "launch.json"), "content": config + "\n"},
            {"path": os.path.join(engines, "tiny.json"), "content": config + "\n"},
            {"path": os.path.join(units, "10-uma-vllm.conf"), "content": "[Service]\nEnvironment=X=1\n" * 10},
        ],
        "secret_files": [{"path": os.path.join(engines, "tiny.env"), "content": "HF_TOKEN=hf_xxx\n"}],
        "lib_dir": os.path.join(base, "lib"),
    }


def per_file_play(base: str) -> list:
    s = node_set(base)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _lab import node_lib

    src = node_lib()  # the node package and its entry scripts, as node_files installs them
    dirs = [{"path": d} for d in [s["lib_dir"], *package_dirs(s["lib_dir"])]]
    tasks = [
        {"name": "Directories", "ansible.builtin.file": {"path": "{{ item.path }}", "state": "directory",
         "mode": "{{ item.mode | default('0755') }}"}, "loop": s["directories"] + dirs},
        {"name": "Files", "ansible.builtin.copy": {"content": "{{ item.content }}", "dest": "{{ item.path }}",
         "mode": "0644"}, "loop": s["files"]},
        {"name": "Secret", "ansible.builtin.copy": {"content": "{{ item.content }}", "dest": "{{ item.path }}",
         "mode": "0600"}, "loop": s["secret_files"], "no_log": True},
        {"name": "Programs", "ansible.builtin.copy": {"src": "%s/{{ item }}" % src,
         "dest": s["lib_dir"] + "/{{ item }}",
         "mode": "0644"}, "loop": program_names()},
    ]  # fmt: skip
    return [{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]


def node_files_play(base: str) -> list:
    args = dict(node_set(base), programs=True)
    return [{"hosts": "localhost", "gather_facts": False, "tasks": [{"name": "All", "uma.vllm.node_files": args}]}]


def run(play_file: str) -> tuple:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache", "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=%s" % sys.executable, play_file],
        capture_output=True, text=True, env=env, check=False, cwd=os.path.dirname(play_file),
    )  # fmt: skip
    wall = time.monotonic() - start
    recap = RECAP.search(done.stdout)
    if done.returncode != 0 or not recap:
        raise SystemExit("ansible-playbook failed:\n" + done.stdout[-3000:] + done.stderr[-2000:])
    return wall, int(recap.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-node-files-") as tmp:
        plays = {}
        for name, build in (("per_file_tasks", per_file_play), ("node_files", node_files_play)):
            base = os.path.join(tmp, name)
            os.makedirs(base)
            play_file = os.path.join(base, "play.yml")
            with open(play_file, "w", encoding="utf-8") as handle:
                json.dump(build(base), handle)  # JSON is YAML
            first = run(play_file)
            if first[1] == 0:
                raise SystemExit("%s: the first run changed nothing (the benchmark is broken)" % name)
            plays[name] = play_file
        walls = {name: [] for name in plays}
        for _round in range(opts.runs):
            for name, play_file in plays.items():
                wall, changed = run(play_file)
                if changed:
                    raise SystemExit("%s: a re-run reported changed=%d, not a no-op" % (name, changed))
                walls[name].append(wall)
    files = len(program_names()) + 4 + 5
    machine = (platform.node(), platform.processor() or platform.machine(), os.cpu_count() or 0)
    out = {
        "machine": "%s, %s, %d CPUs, Python %s" % (*machine, platform.python_version()),
        "paths": files,
        "runs": opts.runs,
        "median_s": {name: round(statistics.median(v), 2) for name, v in walls.items()},
        "all_s": {name: [round(x, 2) for x in v] for name, v in walls.items()},
    }
    if opts.json:
        print(json.dumps(out, indent=2))
        return
    print("no-op re-run, local connection, %d paths (dirs, files, secret file, programs), %d interleaved runs"
          % (files, opts.runs))  # fmt: skip
    print("machine: %s" % out["machine"])
    for name, median in out["median_s"].items():
        print("  %-16s median %6.2f s   runs %s" % (name, median, out["all_s"][name]))


if __name__ == "__main__":
    main()
