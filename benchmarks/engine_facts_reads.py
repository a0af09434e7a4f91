# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What vllm_service's reads of a node cost: the role's five read tasks against one
``uma.vllm.engine_facts`` task (issue 13, item 6: a faster no-op site.yml).

One lab node (``uma-bench-engine-facts``, systemd as PID 1) with a template unit, two engines
installed (one running), their watchdog configs and a stamps file. Each round runs two plays,
in alternating order: "five tasks" (find the drop-ins, slurp the stamps, systemctl show, stat +
find the watchdog configs, as roles/vllm_service had them) and "one task" (engine_facts). Prints
per play the median wall time of ``ansible-playbook`` and the median sum of its task durations
(from the json callback), then removes the node. Run it under the lab lock:

    flock /tmp/uma-lab.lock .venv/bin/python benchmarks/engine_facts_reads.py [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time

from _lab import docker, start_node, wait_systemd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "uma-bench-engine-facts"
SETUP = r"""
set -e
printf '[Unit]\nDescription=bench %%i\n[Service]\nExecStart=/bin/sleep infinity\n' \
  > /etc/systemd/system/uma-vllm@.service
for e in a b; do mkdir -p /etc/systemd/system/uma-vllm@$e.service.d; done
mkdir -p /etc/uma-vllm/watchdog /var/lib/uma-vllm
echo '{}' > /etc/uma-vllm/watchdog/a.json
echo '{"a": "x", "b": "y"}' > /var/lib/uma-vllm/vllm-service.json
systemctl daemon-reload
systemctl start uma-vllm@a.service
"""
HEAD = "- name: %s\n  hosts: all\n  gather_facts: false\n  vars:\n    engines: [a, b]\n  tasks:\n"
FIVE = """    - name: Find the engines installed on this node
      ansible.builtin.find:
        paths: /etc/systemd/system
        patterns: "uma-vllm@*.service.d"
        file_type: directory
    - name: Read what configuration each engine was started with
      ansible.builtin.slurp:
        src: /var/lib/uma-vllm/vllm-service.json
      failed_when: false
    - name: Read the engines' unit states
      ansible.builtin.command:
        argv: "{{ ['systemctl', 'show', '-p', 'Id', '-p', 'ActiveState', '-p', 'UnitFileState']
                  + (engines | map('regex_replace', '^(.*)$', 'uma-vllm@\\\\1.service') | list) }}"
      changed_when: false
    - name: Look for the watchdog config directory
      ansible.builtin.stat:
        path: /etc/uma-vllm/watchdog
      register: wd
    - name: Find the watchdog configs on this node
      ansible.builtin.find:
        paths: /etc/uma-vllm/watchdog
        patterns: "*.json"
      when: wd.stat.isdir | default(false)
"""
ONE = """    - name: Read the engines on this node
      uma.vllm.engine_facts:
        engines: "{{ engines }}"
"""


def run_play(path: str, inventory: str) -> tuple:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.update(
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache/collections"),
    )
    started = time.monotonic()
    run = subprocess.run(
        ["ansible-playbook", "-i", inventory, path], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - started
    if run.returncode != 0:
        raise SystemExit("ansible-playbook %s failed:\n%s\n%s" % (path, run.stdout[-3000:], run.stderr[-2000:]))
    tasks = json.loads(run.stdout)["plays"][0]["tasks"]
    busy = 0.0
    for task in tasks:
        span = task["task"]["duration"]
        start = datetime.datetime.fromisoformat(span["start"].replace("Z", "+00:00"))
        end = datetime.datetime.fromisoformat(span["end"].replace("Z", "+00:00"))
        busy += (end - start).total_seconds()
    return wall, busy, len(tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--image", default="uma-lab/node:bookworm")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-engine-facts-")
    inventory = os.path.join(work, "hosts.yml")
    with open(inventory, "w", encoding="utf-8") as handle:
        handle.write("all:\n  hosts:\n    %s:\n      ansible_connection: community.docker.docker\n" % NAME)
        handle.write("      ansible_python_interpreter: /usr/bin/python3\n")
    plays = {}
    for label, body in (("five tasks", FIVE), ("one task", ONE)):
        plays[label] = os.path.join(work, label.replace(" ", "_") + ".yml")
        with open(plays[label], "w", encoding="utf-8") as handle:
            handle.write(HEAD % label + body)
    samples = {label: [] for label in plays}
    try:
        start_node(NAME, args.image, [])
        state = wait_systemd(NAME)
        if state not in ("running", "degraded"):
            raise SystemExit("systemd in %s did not boot: %r" % (NAME, state))
        docker("exec", NAME, "bash", "-c", SETUP)
        order = list(plays)
        run_play(plays[order[0]], inventory)  # warm-up: page cache, python bytecode on both sides
        for index in range(args.rounds):
            for label in order if index % 2 == 0 else reversed(order):
                samples[label].append(run_play(plays[label], inventory))
    finally:
        docker("rm", "-f", NAME, check=False)
    machine = "%s, %s, %d CPUs" % (platform.node(), platform.processor() or platform.machine(), os.cpu_count() or 0)
    report = {
        "machine": machine,
        "rounds": args.rounds,
        "plays": {
            label: {
                "tasks": runs[0][2],
                "wall_median_s": round(statistics.median(r[0] for r in runs), 3),
                "task_time_median_s": round(statistics.median(r[1] for r in runs), 3),
            }
            for label, runs in samples.items()
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print("machine: %s; %d interleaved rounds, one lab node over the docker connection" % (machine, args.rounds))
    print("%-12s %6s %16s %22s" % ("play", "tasks", "wall median (s)", "task time median (s)"))
    for label, row in report["plays"].items():
        print("%-12s %6d %16.2f %22.2f" % (label, row["tasks"], row["wall_median_s"], row["task_time_median_s"]))


if __name__ == "__main__":
    main()
