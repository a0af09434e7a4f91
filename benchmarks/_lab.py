# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the benchmarks share: memory and cache set-up between runs, docker, and systemd
containers from the lab image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The node package (plugins/module_utils/node: stdlib only, relative imports inside) is importable as
# ``node`` from its parent directory: the benchmarks use it so, with no Ansible on the host side.
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")
sys.path.insert(0, MODULE_UTILS)

import node as node_package
from node.base.common import read_meminfo

# a lab node: systemd as PID 1 without --privileged (see ../shared/LAB-NOTES.md and lab/up.sh)
NODE_RUN_ARGS = [
    "--cap-add", "SYS_ADMIN", "--security-opt", "apparmor=unconfined", "--cgroupns", "host",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
    "--shm-size", "1g", "--stop-signal", "SIGRTMIN+3",
]  # fmt: skip


def meminfo() -> Dict[str, int]:
    """This machine's /proc/meminfo in bytes."""
    return read_meminfo("/proc")


def drop_caches() -> None:
    """sync, then drop page cache, dentries and inodes (a run starts cold; nothing to restore)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as handle:
        handle.write("3\n")


def pretouch(nbytes: int) -> float:
    """Allocate, write and free ``nbytes`` so the run finds warm pages (this VM returns free
    memory to its host: see LAB-NOTES); the seconds it took."""
    import numpy as np

    started = time.perf_counter()
    buf = np.empty(nbytes, dtype=np.uint8)
    buf.fill(1)
    del buf
    return time.perf_counter() - started


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True).stdout


def start_node(name: str, image: str, extra: list) -> None:
    """(Re)create the lab node ``name`` with ``extra`` docker run arguments (volumes)."""
    docker("rm", "-f", name, check=False)
    docker("run", "-d", "--name", name, "--hostname", name, *NODE_RUN_ARGS, *extra, image)


def wait_systemd(name: str, seconds: float = 60.0) -> str:
    """Wait until systemd in ``name`` has booted (running or degraded); its last state."""
    deadline = time.monotonic() + seconds
    state = ""
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["docker", "exec", name, "systemctl", "is-system-running"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if state in ("running", "degraded"):
            break
        time.sleep(0.5)
    return state


# the lab's API key (inventories/lab/group_vars/spark.yml), not a secret, and the lab engine tp2's port
LAB_KEY = "uma-lab-key-not-secret"
LAB_PORT = 8100


def lab_completion_ok(node: str, max_tokens: int, curl_timeout_s: int, exec_timeout_s: float) -> bool:
    """A ``max_tokens`` completion of the lab model answered 200 through ``node`` (rank 0), curl bounded
    by ``curl_timeout_s``, the docker exec by ``exec_timeout_s`` (past it: subprocess.TimeoutExpired)."""
    body = json.dumps({"model": "/models/tiny-1g", "prompt": "hello", "max_tokens": max_tokens})
    argv = ["docker", "exec", node, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", str(curl_timeout_s),
            "-H", "Authorization: Bearer %s" % LAB_KEY, "-H", "Content-Type: application/json",
            "-d", body, "http://127.0.0.1:%d/v1/completions" % LAB_PORT]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=exec_timeout_s, check=False).stdout
    return out.strip() == "200"


def node_lib_files():
    """(path under lib_dir, text) of what uma.vllm.node_files installs (programs: true): every file of the
    node package under ``uma_vllm_node/`` and the entry scripts (plugins/module_utils/plumbing/node_install.py
    says it with its one list; tests/unit/test_benchmark_uma_vm.py checks the two agree)."""
    top = os.path.join(MODULE_UTILS, "node")
    files = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(dirpath, name), top).replace(os.sep, "/")
            with open(os.path.join(dirpath, name), encoding="utf-8") as handle:
                files.append((node_package.PACKAGE_DIR + "/" + rel, handle.read()))
    files.extend((name, node_package.entry_script(module, what)) for name, module, what in node_package.ENTRY_SCRIPTS)
    return files


def node_lib(dest: str = os.path.join(ROOT, ".cache", "node-lib")) -> str:
    """``dest`` made afresh with the node programs as a node has them (``dest/uma_launch.py``, ...)."""
    import shutil

    shutil.rmtree(dest, ignore_errors=True)
    for rel, text in node_lib_files():
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    return dest
