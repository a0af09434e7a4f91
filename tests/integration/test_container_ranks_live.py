"""The launcher's watch of a rank's ``VLLM::`` processes with the container runtime, against this
machine's real Docker (issue 19).

The launcher starts the docker client (``docker run --rm --name NAME ...``, attached, as the
role renders it); the container's processes descend from the container runtime, not from that
client. Here the lab image runs a stand-in for vLLM's worker (a copy of ``sleep`` named
``VLLM::Worker_TP1``: only the process title matters to the watch) below the container's init,
the launcher's own ``_ranks.vllm_processes`` finds it through ``docker inspect``, and a SIGKILL
of it is seen by ``_ranks.gone`` -- the path that made a dead rank process in a container go
unnoticed before (the watch looked below the client and found nothing).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
from test_vllm_parser_oracle import IMAGE

from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import ranks as _ranks

NAME = "uma-itest-ranks-%d" % os.getpid()


def _require_docker():
    reason = None
    if shutil.which("docker") is None:
        reason = "docker is not installed"
    else:
        probe = subprocess.run(["docker", "image", "inspect", IMAGE], check=False, capture_output=True, text=True)
        if probe.returncode != 0:
            reason = "docker or the lab image %s is not available: %s" % (IMAGE, (probe.stderr or "").strip()[:200])
    if reason is None:
        return
    if os.environ.get("UMA_REQUIRE_VLLM") == "1":
        pytest.fail("UMA_REQUIRE_VLLM=1 but %s" % reason)
    pytest.skip(reason)


@pytest.fixture
def client():
    _require_docker()
    argv = [
        shutil.which("docker"), "run", "--rm", "--name", NAME, "--network", "none", IMAGE,
        "/bin/sh", "-c", 'cp /bin/sleep "/tmp/VLLM::Worker_TP1" && "/tmp/VLLM::Worker_TP1" 300 & wait',
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        subprocess.run(["docker", "rm", "-f", NAME], check=False, capture_output=True)
        proc.kill()
        proc.wait(30)


def test_a_dead_vllm_process_inside_the_container_is_seen(client):
    watched = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and client.poll() is None:
        watched = _ranks.vllm_processes(client.pid, "/proc", client.args)
        if watched:
            break
        time.sleep(0.5)
    assert list(watched.values()) == ["VLLM::Worker_TP"], (watched, client.poll())
    # the client the launcher started has no VLLM:: process below it: the old watch saw nothing
    assert _ranks.vllm_processes(client.pid, "/proc") == {}
    assert _ranks.gone(watched, "/proc") == []
    pid = next(iter(watched))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _ranks.gone(watched, "/proc"):
        time.sleep(0.2)
    assert _ranks.gone(watched, "/proc") == [(pid, "VLLM::Worker_TP")]
