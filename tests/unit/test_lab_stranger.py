"""molecule/cluster/stranger.py, the firewall drill's eyes (engine.sh strangers / forged-hello): what it
calls open, refused and dropped, and what the status server of the real watchdog answers its forged
requests. The drill itself needs the container lab (molecule/cluster_container)."""

from __future__ import annotations

import http.client
import importlib.util
import pathlib
import socket
import subprocess
import sys
import time

from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import link_auth
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import probes

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "molecule" / "cluster" / "stranger.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=30, check=False)


def test_an_accepting_port_is_open_and_a_closed_one_refused():
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)
        closed.bind(("127.0.0.1", 0))  # bound, never listening: the kernel answers with a reset
        open_port, closed_port = listening.getsockname()[1], closed.getsockname()[1]
        out = run("probe", "2", "127.0.0.1:%d" % open_port, "127.0.0.1:%d" % closed_port)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["127.0.0.1:%d open" % open_port, "127.0.0.1:%d refused" % closed_port]


def test_a_port_that_never_answers_is_dropped():
    # a listener whose backlog is full and never accepts: the kernel drops further SYNs, as a drop rule does
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(0)
        port = listening.getsockname()[1]
        fillers = []
        try:
            for _attempt in range(8):
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
                fillers.append(filler)
            out = run("probe", "1", "127.0.0.1:%d" % port)
        finally:
            for filler in fillers:
                filler.close()
    assert out.stdout.strip() == "127.0.0.1:%d dropped" % port, out.stdout + out.stderr


def test_the_watchdogs_status_server_refuses_both_forged_requests_and_names_the_peer():
    said = []
    server = probes.StatusServer("127.0.0.1", 0, key=b"k" * 32, say=said.append)
    try:
        out = run("forge-status", "127.0.0.1:%d" % server.port)
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["status 401 (without a MAC)", "status 401 (with another key's MAC)"]
    # the first refusal is named (one line per peer address and interval), both are counted
    assert said and said[0].startswith("refused a status request without a MAC from 127.0.0.1:"), said
    assert server.refusals.count == 2


def load_stranger():
    spec = importlib.util.spec_from_file_location("lab_stranger", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_forged_status_request_is_signed_like_the_real_one():
    # stranger.py writes the status request's MAC data and headers again (it runs alone in a lab node):
    # with the engine's own key its request must be the real one, so only the key makes it a forgery
    stranger = load_stranger()
    assert stranger.STATUS_HEADERS == (link_auth.HEADER_NONCE, link_auth.HEADER_TIME, link_auth.HEADER_MAC)
    assert stranger.status_request_data("n1", "12.500") == link_auth._request_data("GET", "/status", "n1", "12.500")
    key = b"k" * 32
    server = probes.StatusServer("127.0.0.1", 0, key=key, say=lambda line: None)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/status", headers=stranger.signed_status_headers(key, "abcd", "%.3f" % time.time()))
        status = conn.getresponse().status
        conn.close()
    finally:
        server.close()
    assert status == 200
    assert server.refusals.count == 0


def test_a_bad_command_line_exits_2_with_the_usage():
    out = run("probe")
    assert out.returncode == 2 and "stranger.py probe SECONDS" in out.stderr
