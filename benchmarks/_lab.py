# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the benchmarks share: docker, and systemd containers from the lab image."""

from __future__ import annotations

import subprocess
import time

# a lab node: systemd as PID 1 without --privileged (see ../shared/LAB-NOTES.md and lab/up.sh)
NODE_RUN_ARGS = [
    "--cap-add", "SYS_ADMIN", "--security-opt", "apparmor=unconfined", "--cgroupns", "host",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
    "--shm-size", "1g", "--stop-signal", "SIGRTMIN+3",
]  # fmt: skip


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
