# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the benchmarks share: memory and cache set-up between runs, docker, and systemd
containers from the lab image."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins", "module_utils"))

from _common import read_meminfo  # the collection's own parser, as the guard runs it on a node

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
