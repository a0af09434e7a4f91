"""playbooks/link_check.yml's pairs and report (issue 35 item 4). The probe itself runs for real here
over loopback (two processes, real sockets) and on the lab's two nodes in molecule/cluster
(side_effect)."""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.uma.vllm.plugins.filter import link_check as filters
from ansible_collections.uma.vllm.plugins.module_utils.service import link_check as lc
from ansible_collections.uma.vllm.plugins.module_utils.service.base import EngineModelError

ROOT = pathlib.Path(__file__).resolve().parents[4]
PROBE = ROOT / "playbooks" / "files" / "link_probe.py"

ENGINES = [
    {"name": "tp2", "nodes": ["ai1", "ai2"], "port": 8100},
    {"name": "tp2-ray", "nodes": ["ai1", "ai2"], "port": 8200, "master_port": 29601},
    {"name": "solo", "port": 8000},
    {"name": "gone", "nodes": ["ai1", "ai3"], "port": 8300, "state": "absent"},
]


def facts(addr, speed):
    eth0 = {"device": "eth0", "active": True, "mtu": 9000, "speed": speed, "ipv4": {"address": addr}}
    return {"interfaces": ["eth0"], "eth0": eth0}


HOSTVARS = {
    "ai1": {"uma_cluster_addr": "192.168.100.11", "ansible_facts": facts("192.168.100.11", 200000)},
    "ai2": {"uma_cluster_addr": "192.168.100.12", "ansible_facts": facts("192.168.100.12", 200000)},
}


def test_two_engines_on_one_pair_are_one_measurement_named_for_both():
    (pair,) = lc.pairs(ENGINES, HOSTVARS, ["ai1", "ai2"])
    assert (pair["server"], pair["client"], pair["port"], pair["problem"]) == ("ai1", "ai2", 29590, None)
    assert pair["engines"] == ["tp2", "tp2-ray"]
    assert (pair["server_addr"], pair["client_addr"]) == ("192.168.100.11", "192.168.100.12")


def test_a_node_outside_the_play_is_named_not_measured():
    (pair,) = lc.pairs(ENGINES, HOSTVARS, ["ai1"])
    assert pair["problem"] == "ai2 is not in this play (--limit, or unreachable)"
    out = lc.report([pair], [], HOSTVARS)
    assert out["lines"][0].endswith("not measured, ai2 is not in this play (--limit, or unreachable)")


@pytest.mark.parametrize("port", [80, 70000, "x", True, 8100, 29501, 29511, 29512, 29601])
def test_a_bad_or_busy_probe_port_is_refused_naming_it(port):
    with pytest.raises(EngineModelError, match=r"link_check_port = .* Fix: Give link_check_port"):
        lc.pairs(ENGINES, HOSTVARS, ["ai1", "ai2"], port)


def test_a_busy_port_names_the_engine_and_what_listens_there():
    with pytest.raises(EngineModelError, match=r"gives port 8100 on ai1, where engine tp2's API listens"):
        lc.pairs(ENGINES, HOSTVARS, ["ai1", "ai2"], 8100)


def test_the_report_says_the_numbers_against_the_interface_rate():
    pairs = lc.pairs(ENGINES, HOSTVARS, ["ai1", "ai2"])
    got = {"rtt_us_median": 21.4, "rtt_us_p99": 90.0, "pings": 200, "bytes": 10**9, "seconds": 3.0, "gbit_s": 50.0}
    out = lc.report(pairs, [{"item": pairs[0], "stdout": json.dumps(got), "rc": 0}], HOSTVARS)
    assert out["lines"][0] == (
        "tp2, tp2-ray: ai2 (192.168.100.12) -> ai1 (192.168.100.11): TCP 50.00 Gbit/s (25% of eth0, 200 Gbit/s),"
        " round trip median 21 us, p99 90 us (200 pings, 3.0 s)"
    )
    assert out["lines"][
        1
    ] == "    RDMA: ai2: RDMA devices not read; ai1: RDMA devices not read; not measured here (run" + (
        " perftest's ib_write_bw -d <device> -x <GID index> --report_gbits on one node and the same with the other's"
        " address on the other)"
    )
    assert out["pairs"][0]["speed_mbit"] == 200000


def test_a_probe_that_printed_nothing_is_a_line_not_a_traceback():
    pairs = lc.pairs(ENGINES, HOSTVARS, ["ai1", "ai2"])
    out = lc.report(pairs, [{"item": pairs[0], "stdout": "", "stderr": "python3: not found", "rc": 127}], HOSTVARS)
    assert "TCP probe failed: the probe printed no result (rc 127): python3: not found" in out["lines"][0]
    err = {"error": "cannot connect from a to b:29590: timed out"}
    out = lc.report(pairs, [{"item": pairs[0], "stdout": json.dumps(err), "rc": 1}], HOSTVARS)
    assert "TCP probe failed: cannot connect from a to b:29590: timed out" in out["lines"][0]


def test_rdma_on_the_nodes_is_named_with_the_device_and_gid_index():
    found = {"present": True, "cluster": {"found": True, "device": "rocep1s0f1", "port": 1, "gid_index": 3}}
    hv = {h: dict(v, __link_rdma={"ansible_facts": {"uma_rdma": found}}) for h, v in HOSTVARS.items()}
    pairs = lc.pairs(ENGINES, hv, ["ai1", "ai2"])
    out = lc.report(pairs, [], hv)
    assert "RDMA: ai2: rocep1s0f1 port 1, RoCE v2 GID index 3; ai1: rocep1s0f1 port 1" in out["lines"][1]
    assert "not measured here" in out["lines"][1]


def test_no_multi_node_engine_says_so():
    assert lc.report(lc.pairs([ENGINES[2]], HOSTVARS, ["ai1"]), [], HOSTVARS)["lines"] == [
        "no multi-node engine in vllm_service_engines: nothing to measure"
    ]
    assert set(filters.FilterModule().filters()) == {"link_check_pairs", "link_check_report"}


def test_the_probe_measures_over_loopback():
    """The node-side probe as link_check.yml runs it (python3 -c), two processes, real sockets."""
    code = PROBE.read_text()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", code, "server", "127.0.0.1", str(port), "20"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(0.3)
    client = subprocess.run([sys.executable, "-c", code, "client", "127.0.0.1", "127.0.0.1", str(port), "0.5"],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    out = json.loads(client.stdout)
    served = json.loads(server.communicate(timeout=30)[0])
    assert out["gbit_s"] > 0 and out["pings"] == 200 and 0 < out["rtt_us_median"] <= out["rtt_us_p99"]
    assert served["bytes"] == out["bytes"] > 0 and server.returncode == 0


def test_the_probe_says_what_went_wrong_when_nobody_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = PROBE.read_text()
    start = time.monotonic()
    lone = subprocess.run([sys.executable, "-c", code, "server", "127.0.0.1", str(port), "0.3"],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert lone.returncode == 1 and json.loads(lone.stdout) == {"error": "no client within 0 s"}
    assert time.monotonic() - start < 10
