"""The cluster link's firewall (issue 19 item 7): the nft rules the vllm_service role installs,
as text and for real: loaded by the real nft into a private network namespace (a stand-in for a
node: this machine's own ruleset is never touched), where a peer's address reaches the engine's
cluster ports and a third address does not, while the API port stays open."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.service import engines as vs
from ansible_collections.uma.vllm.plugins.module_utils.service import firewall as fw
from ansible_collections.uma.vllm.plugins.module_utils.service.engines import EngineModelError

HOSTVARS = {"ai1": {"uma_cluster_addr": "10.77.0.1"}, "ai2": {"__vllm_service_node": {"addr": "10.77.0.2"}}}


def engines(host="ai1", **extra):
    tp2 = dict({"name": "tp2", "nodes": ["ai1", "ai2"], "port": 8000, "model_path": "/m",
                "plan": {"tensor_parallel_size": 2}}, **extra)  # fmt: skip
    solo = {"name": "solo", "port": 8001, "model_path": "/m"}
    return vs.host_engines([tp2, solo], host, "mp")


def test_rules_drop_strangers_on_the_engines_cluster_ports_only():
    text = fw.firewall_rules(engines(), HOSTVARS, "Managed by uma.vllm (role vllm_service)")
    assert text.startswith("#!/usr/sbin/nft -f\n# Managed by uma.vllm (role vllm_service)\n")
    assert "table inet uma_vllm\ndelete table inet uma_vllm\ntable inet uma_vllm {" in text
    assert 'iif "lo" accept' in text
    assert (
        "meta nfproto ipv4 tcp dport { 29501, 29511, 29512, 29513 } ip saddr != { 10.77.0.1, 10.77.0.2 } drop" in text
    )
    assert "meta nfproto ipv6 tcp dport { 29501, 29511, 29512, 29513 } drop" in text  # no IPv6 node: none may
    assert "8000" not in text and "8001" not in text  # the API is the API key's, not the firewall's
    assert fw.firewall_rules(engines(), HOSTVARS) == fw.firewall_rules(engines("ai2"), HOSTVARS)


def test_ray_port_and_own_ports_and_no_multi_node_engine():
    text = fw.firewall_rules(engines(backend="ray", master_port=30000, watchdog_port=31000), HOSTVARS)
    assert "tcp dport { 6379, 30000, 30010, 30012, 31000 }" in text
    assert fw.firewall_rules(vs.host_engines([{"name": "solo", "port": 1, "model_path": "/m"}], "ai1"), {}) == ""
    v6 = {"ai1": {"uma_cluster_addr": "fd00::1"}, "ai2": {"uma_cluster_addr": "fd00::2"}}
    text = fw.firewall_rules(engines(), v6)
    assert "ip6 saddr != { fd00::1, fd00::2 } drop" in text and "meta nfproto ipv4 tcp dport" in text


@pytest.mark.parametrize("addr", ["ai2.lan", None, "10.0.0.2; flush ruleset", "10.0.0.2\ndrop"])
def test_a_node_without_an_ip_cluster_address_is_refused_with_the_fix(addr):
    with pytest.raises(EngineModelError) as err:
        fw.firewall_rules(engines(), {"ai1": HOSTVARS["ai1"], "ai2": {"uma_cluster_addr": addr}})
    assert "uma_cluster_addr of ai2" in str(err.value) and "vllm_service_firewall: false" in str(err.value)


def test_the_ephemeral_range_is_closed_on_this_nodes_cluster_address_to_every_engines_strangers():
    text = fw.firewall_rules(engines(), HOSTVARS, "M", "ai1", "32768\t60999\n")
    rule = (
        "meta nfproto ipv4 ip daddr 10.77.0.1 tcp dport 32768-60999 ct state new ip saddr != { 10.77.0.1, 10.77.0.2 }"
        " drop"
    )
    assert rule in text
    assert "ip daddr 10.77.0.2 tcp dport 32768-60999" in fw.firewall_rules(
        engines("ai2"), HOSTVARS, "M", "ai2", "32768 60999"
    )
    # without the range (vllm_service_firewall_ephemeral: false) no such rule; nor for a node without engines
    assert "ct state new" not in fw.firewall_rules(engines(), HOSTVARS, "M", "ai1", None)
    assert fw.firewall_rules([], HOSTVARS, "M", "ai1", "32768 60999") == ""
    # two engines that share ai1: one rule, every engine's nodes allowed (neither drops the other's peers)
    hv = dict(HOSTVARS, ai3={"uma_cluster_addr": "10.77.0.3"})
    both = vs.host_engines(
        [{"name": "a", "nodes": ["ai1", "ai2"], "port": 8000, "model_path": "/m", "plan": {"tensor_parallel_size": 2}},
         {"name": "b", "nodes": ["ai1", "ai3"], "port": 8001, "model_path": "/m", "master_port": 30501,
          "plan": {"tensor_parallel_size": 2}}], "ai1", "mp")  # fmt: skip
    text = fw.firewall_rules(both, hv, "M", "ai1", "40000 50000")
    assert text.count("ct state new") == 1
    assert (
        "ip daddr 10.77.0.1 tcp dport 40000-50000 ct state new ip saddr != { 10.77.0.1, 10.77.0.2, 10.77.0.3 } drop"
        in text
    )
    v6 = {"ai1": {"uma_cluster_addr": "fd00::1"}, "ai2": {"uma_cluster_addr": "fd00::2"}}
    assert (
        "meta nfproto ipv6 ip6 daddr fd00::1 tcp dport 32768-60999 ct state new ip6 saddr != { fd00::1, fd00::2 }"
        in (fw.firewall_rules(engines(), v6, "M", "ai1", "32768 60999"))
    )


def test_an_api_port_inside_the_ephemeral_range_stays_open_to_clients():
    tp2 = {
        "name": "tp2",
        "nodes": ["ai1", "ai2"],
        "port": 40000,
        "model_path": "/m",
        "plan": {"tensor_parallel_size": 2},
    }
    solo = {"name": "solo", "port": 8001, "model_path": "/m"}
    text = fw.firewall_rules(vs.host_engines([tp2, solo], "ai1", "mp"), HOSTVARS, "M", "ai1", "32768 60999")
    assert "tcp dport 32768-60999 tcp dport != { 40000 } ct state new ip saddr" in text
    assert "8001" not in text  # below the range: no exception needed


@pytest.mark.parametrize(
    "text", ["", "60999", "a b", "0 100", "61000 32768", "32768 70000", "1 2 3", "-1 5", "\uff13\uff12 60999"]
)
def test_a_range_that_is_not_two_ports_is_refused_naming_the_file_and_the_fix(text):
    with pytest.raises(EngineModelError) as err:
        fw.firewall_rules(engines(), HOSTVARS, "M", "ai1", text)
    message = str(err.value)
    assert "/proc/sys/net/ipv4/ip_local_port_range" in message and repr(text) in message
    assert "vllm_service_firewall_ephemeral: false" in message


def test_this_nodes_own_address_must_be_an_ip_for_the_ephemeral_rule():
    hv = {"ai1": {"uma_cluster_addr": "10.77.0.1"}, "ai2": {"uma_cluster_addr": "10.77.0.2"}, "ai9": {}}
    with pytest.raises(EngineModelError) as err:
        fw.firewall_rules(engines(), hv, "M", "ai9", "32768 60999")
    assert "cluster address of ai9" in str(err.value) and "vllm_service_firewall_ephemeral: false" in str(err.value)


# ---------------------------------------------------------------- the real nft, in a private namespace

NS_NODE, NS_OUT, VETH = "i19-hmac-fw-node", "i19-hmac-fw-out", "i19hfw"
PROBE = textwrap.dedent("""
    import json, socket, sys
    out = {}
    for source in sys.argv[1].split(","):
        for port in map(int, sys.argv[2].split(",")):
            s = socket.socket()
            s.settimeout(1.0)
            s.bind((source, 0))
            try:
                s.connect(("10.77.0.1", port))
                out["%s:%d" % (source, port)] = "open"
            except socket.timeout:
                out["%s:%d" % (source, port)] = "dropped"
            except OSError as err:
                out["%s:%d" % (source, port)] = "error %s" % err
            finally:
                s.close()
    print(json.dumps(out))
""")
LISTEN = textwrap.dedent("""
    import socket, threading, time
    for port in (8000, 29501, 29511, 29512, 40000):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(64)
        threading.Thread(target=lambda s=s: [s.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
    print("listening", flush=True)
    time.sleep(120)
""")


def sh(*argv, check=True):
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


@pytest.fixture
def namespaces():
    if os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("ip"):
        pytest.skip("needs root, nft (Debian package nftables, tests/setup.sh installs it) and ip")
    for ns in (NS_NODE, NS_OUT):
        sh("ip", "netns", "del", ns, check=False)
    made = sh("ip", "netns", "add", NS_NODE, check=False)
    if made.returncode != 0:
        pytest.skip("cannot make a network namespace here: %s" % made.stderr.strip())
    try:
        sh("ip", "netns", "add", NS_OUT)
        sh("ip", "link", "add", VETH + "0", "netns", NS_NODE, "type", "veth", "peer", "name", VETH + "1",
           "netns", NS_OUT)  # fmt: skip
        sh("ip", "-n", NS_NODE, "addr", "add", "10.77.0.1/24", "dev", VETH + "0")
        sh("ip", "-n", NS_OUT, "addr", "add", "10.77.0.2/24", "dev", VETH + "1")  # the peer (ai2)
        sh("ip", "-n", NS_OUT, "addr", "add", "10.77.0.3/24", "dev", VETH + "1")  # a third lab node
        for ns, dev in ((NS_NODE, VETH + "0"), (NS_OUT, VETH + "1")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        listener = subprocess.Popen(["ip", "netns", "exec", NS_NODE, sys.executable, "-c", LISTEN],
                                    stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert listener.stdout.readline().strip() == "listening"
        yield
        listener.kill()
        listener.wait()
    finally:
        for ns in (NS_NODE, NS_OUT):
            sh("ip", "netns", "del", ns, check=False)


def probe(ports="8000,29501,29511,29512"):
    done = sh("ip", "netns", "exec", NS_OUT, sys.executable, "-c", PROBE, "10.77.0.2,10.77.0.3", ports)
    return json.loads(done.stdout)


# the node's own connection out to a third address: its reply comes back to an ephemeral port (not new)
OUTGOING = textwrap.dedent("""
    import socket, sys
    s = socket.create_connection(("10.77.0.3", 29000), timeout=2)
    print(s.getsockname()[1], s.recv(16).decode())
""")
SERVE_ONCE = textwrap.dedent("""
    import socket
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("10.77.0.3", 29000))
    s.listen(1)
    print("listening", flush=True)
    c, _ = s.accept()
    c.sendall(b"reply")
    c.close()
""")


def test_the_rules_for_real_a_third_node_is_dropped_the_peer_and_the_api_are_not(namespaces, tmp_path):
    before = probe()
    assert set(before.values()) == {"open"}, before  # the check can fail: everything open without rules
    rules = tmp_path / "firewall.nft"
    rules.write_text(fw.firewall_rules(engines(), HOSTVARS))
    for _load in range(2):  # loading twice replaces the table (no duplicate rules, no error)
        sh("ip", "netns", "exec", NS_NODE, "nft", "-f", str(rules))
    listed = sh("ip", "netns", "exec", NS_NODE, "nft", "list", "table", "inet", "uma_vllm").stdout
    assert listed.count("drop") == 2, listed
    after = probe()
    assert after == {
        "10.77.0.2:8000": "open", "10.77.0.2:29501": "open", "10.77.0.2:29511": "open", "10.77.0.2:29512": "open",
        "10.77.0.3:8000": "open", "10.77.0.3:29501": "dropped", "10.77.0.3:29511": "dropped",
        "10.77.0.3:29512": "dropped",
    }, after  # fmt: skip
    sh("ip", "netns", "exec", NS_NODE, "nft", "delete", "table", "inet", "uma_vllm")  # what state: absent runs
    assert set(probe().values()) == {"open"}


def test_the_ephemeral_rule_for_real_strangers_dropped_the_peer_and_the_nodes_own_replies_not(namespaces, tmp_path):
    assert set(probe("40000").values()) == {"open"}  # the check can fail: open without rules
    rules = tmp_path / "firewall.nft"
    rules.write_text(fw.firewall_rules(engines(), HOSTVARS, "M", "ai1", "32768 60999"))
    sh("ip", "netns", "exec", NS_NODE, "nft", "-f", str(rules))
    assert probe("8000,29501,40000") == {
        "10.77.0.2:8000": "open", "10.77.0.2:29501": "open", "10.77.0.2:40000": "open",
        "10.77.0.3:8000": "open", "10.77.0.3:29501": "dropped", "10.77.0.3:40000": "dropped",
    }  # fmt: skip
    server = subprocess.Popen(["ip", "netns", "exec", NS_OUT, sys.executable, "-c", SERVE_ONCE],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout.readline().strip() == "listening"
        out = sh("ip", "netns", "exec", NS_NODE, sys.executable, "-c", OUTGOING).stdout.split()
    finally:
        server.kill()
        server.wait()
    assert 32768 <= int(out[0]) <= 60999 and out[1] == "reply", out  # the stranger's reply reached the node
    sh("ip", "netns", "exec", NS_NODE, "nft", "delete", "table", "inet", "uma_vllm")
