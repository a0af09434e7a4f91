"""Issue 35 item 3: a multi-node engine's cluster link checked on all its nodes before anything changes.

The node's end (``view``) is read from real network facts (tests/unit/fixtures/net: ansible-core's
setup module on the build VM: eth0 up at MTU 1400, Docker's bridge docker0 with an address and not
active, lo); the other node's facts are that node's with one thing changed per case, as a pair of
Sparks would differ (an MTU, a port down, an address on no interface, another transport)."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.filter import vllm_service as filters
from ansible_collections.uma.vllm.plugins.module_utils.service import link_preflight as lp

FACTS = json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "net" / "build_vm_network_facts.json").read_text()
)


def engine(name="tp2", nodes=("ai1", "ai2"), **extra):
    out = {
        "name": name,
        "port": 8100,
        "cluster": {"nodes": list(nodes), "head": nodes[0], "rank": 0, "nnodes": len(nodes)},
    }
    out.update(extra)
    return out


def node(facts=None, addr="192.0.2.2", ifname="eth0", transport="tcp", name="tp2"):
    return {
        "__vllm_service_link_view": lp.view(FACTS if facts is None else facts, addr, ifname),
        "__vllm_service_links": {name: {"transport": transport}},
    }


def with_mtu(mtu, iface="eth0"):
    facts = copy.deepcopy(FACTS)
    facts[iface]["mtu"] = mtu
    return facts


def test_the_real_facts_find_the_address_its_interface_state_and_mtu():
    seen = lp.view(FACTS, "192.0.2.2", "eth0")
    assert (seen["checked"], seen["interface"], seen["up"], seen["mtu"]) == (True, "eth0", True, 1400)
    assert lp.view(FACTS, "fd00::2", None)["interface"] == "eth0"  # an IPv6 cluster address
    assert lp.view(FACTS, "172.17.0.1", None)["up"] is False  # docker0: an address, not active


def test_a_healthy_pair_passes_and_the_plan_says_what_was_checked():
    out = lp.preflight([engine()], {"ai1": node(), "ai2": node()})
    assert out["errors"] == []
    assert out["lines"]["tp2"] == ["link preflight: ai1 eth0 up mtu 1400; ai2 eth0 up mtu 1400"]


def test_different_mtus_on_the_two_ends_are_refused_naming_both_and_the_fix():
    out = lp.preflight([engine()], {"ai1": node(), "ai2": node(facts=with_mtu(9000))})
    assert len(out["errors"]) == 1
    error = out["errors"][0]
    assert "engine tp2" in error and "ai1 eth0 mtu 1400" in error and "ai2 eth0 mtu 9000" in error
    assert "different MTUs" in error and "Fix: Set one MTU" in error and "ip link set dev" in error


def test_an_address_on_an_interface_that_is_down_is_refused_naming_node_and_interface():
    down = node(facts=with_mtu(1400, "docker0"), addr="172.17.0.1", ifname="docker0")  # the same MTU: one refusal
    out = lp.preflight([engine()], {"ai1": node(), "ai2": down})
    assert len(out["errors"]) == 1, out
    error = out["errors"][0]
    assert "uma_cluster_addr = '172.17.0.1' of host ai2 (engine tp2) is on interface docker0, which is down" in error
    assert "ip link set dev docker0 up" in error


def test_an_address_on_no_interface_is_refused_with_what_the_node_has():
    out = lp.preflight([engine()], {"ai1": node(), "ai2": node(addr="192.168.100.12")})
    assert len(out["errors"]) == 1
    error = out["errors"][0]
    assert "'192.168.100.12' of host ai2 (engine tp2) is on none of its interfaces" in error
    assert "eth0 192.0.2.2" in error and "host_vars/ai2.yml" in error


@pytest.mark.parametrize("ifname, refused", [
    ("eth0", False), ("eth", False), ("=eth0", False), ("enp1s0f1np1,eth0", False), ("^docker,lo", False),
    ("enp1s0f1np1", True), ("=eth", True), ("docker0", True),
])  # fmt: skip
def test_the_socket_interface_must_select_the_interface_of_the_address(ifname, refused):
    out = lp.preflight([engine()], {"ai1": node(ifname=ifname), "ai2": node()})
    assert bool(out["errors"]) is refused, out
    if refused:
        assert (
            "vllm_service_nccl_socket_ifname = %r on host ai1 (engine tp2) does not select eth0" % ifname
            in out["errors"][0]
        )
        assert "uma_net_interface in host_vars/ai1.yml to eth0" in out["errors"][0]


def test_rdma_on_one_end_and_tcp_on_the_other_is_refused():
    out = lp.preflight([engine()], {"ai1": node(transport="rdma"), "ai2": node()})
    assert len(out["errors"]) == 1
    assert "ai1 RDMA, ai2 TCP sockets" in out["errors"][0] and "rdma: false" in out["errors"][0]


def test_a_node_not_in_this_play_or_without_network_facts_is_named_not_refused():
    out = lp.preflight([engine()], {"ai1": node()})
    assert out["errors"] == []
    assert "link preflight: host ai2 not checked (not in this play, or it failed before)" in out["lines"]["tp2"]
    out = lp.preflight([engine()], {"ai1": node(), "ai2": node(facts={})})
    assert "link preflight: host ai2 not checked (its network facts were not gathered)" in out["lines"]["tp2"]


def test_single_node_and_absent_engines_are_not_checked():
    single = {"name": "one", "port": 8000, "cluster": None}
    gone = engine(state="absent")
    assert lp.preflight([single, gone], {"ai1": node(facts=with_mtu(9000)), "ai2": node()}) == {
        "errors": [],
        "lines": {},
    }


BOTH = {"tp2": {"transport": "tcp"}, "big": {"transport": "tcp"}}


def test_every_engine_is_checked_and_named_on_its_own():
    hosts = {"ai1": dict(node(), __vllm_service_links=BOTH)}
    hosts["ai2"] = dict(node(facts=with_mtu(9000)), __vllm_service_links=BOTH)
    out = lp.preflight([engine(), engine(name="big")], hosts)
    assert len(out["errors"]) == 2 and "engine tp2" in out["errors"][0] and "engine big" in out["errors"][1]


def test_the_role_reaches_both_through_its_filters():
    found = filters.FilterModule().filters()
    assert found["vllm_service_link_view"](FACTS, "192.0.2.2", "eth0")["interface"] == "eth0"
    assert found["vllm_service_link_preflight"]([engine()], {"ai1": node(), "ai2": node()})["errors"] == []
