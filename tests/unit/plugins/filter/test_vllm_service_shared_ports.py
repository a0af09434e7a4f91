# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 34 item 4: several engines on one pair never share a port on a node.

Before: each engine's ports were checked within the engine only, so two TP=2 engines on ai1+ai2
with the default master_port (29501) both passed the role's check, and the collision showed at
runtime (the second store, rank link, watchdog status and model copy could not bind). Now the
role's check (``vllm_service.check``, run before anything changes, in check mode too) refuses it,
naming both engines, the key to change and a free value.
"""

from __future__ import annotations

import pytest
from vllm_service_cases import HOSTS, NATIVE, engine

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs
from ansible_collections.uma.vllm.plugins.module_utils.service.base import node_ports

ADDRS = {"ai1": "10.0.0.1", "ai2": "10.0.0.2"}
TP2 = {"tensor_parallel_size": 2}
KEY = {"VLLM_API_KEY": "k"}


def pair(name, port, nodes=("ai1", "ai2"), **kw):
    return engine(name=name, port=port, nodes=list(nodes), plan=TP2, secrets=KEY, **kw)


def errors_on(host, *engines):
    return vs.check(vs.host_engines(list(engines), host, "mp"), NATIVE, HOSTS, ADDRS)


def test_two_pair_engines_with_the_default_master_port_are_refused_on_both_nodes_naming_both():
    a, b = pair("qwen", 8000), pair("llama", 8001)
    (on_ai1,) = errors_on("ai1", a, b)
    assert on_ai1.startswith(
        "vllm_service_engines[llama].master_port = 29501 puts its torch.distributed store on port 29501"
    )
    assert "engine qwen's torch.distributed store" in on_ai1
    assert "Fix: Give engine llama its own master_port, e.g. 29601" in on_ai1
    # rank 1's node: only the watchdogs' status port listens there, and it collides too
    (on_ai2,) = errors_on("ai2", a, b)
    assert "port 29512" in on_ai2 and "engine qwen's watchdog status" in on_ai2 and "e.g. 29601" in on_ai2


def test_the_suggested_master_port_is_free():
    a, b = pair("qwen", 8000), pair("llama", 8001)
    for host in ("ai1", "ai2"):
        assert errors_on(host, a, dict(b, master_port=29601)) == []


def test_a_pair_engine_with_its_rank_0_on_the_other_node_still_collides_on_the_status_port():
    a, b = pair("qwen", 8000), pair("llama", 8001, nodes=("ai2", "ai1"))
    (err,) = errors_on("ai1", a, b)
    assert "[llama].master_port = 29501" in err and "port 29512" in err


def test_a_single_node_engine_on_a_derived_port_is_named():
    (err,) = errors_on("ai1", pair("qwen", 8000), engine(name="small", port=29511, secrets=KEY))
    assert err.startswith("vllm_service_engines[small].port = 29511 puts its API on port 29511")
    assert "engine qwen's rank link" in err and "e.g. 29514" in err  # 29512 and 29513 are qwen's too


def test_two_ray_heads_on_one_node_name_ray_port():
    a = pair("qwen", 8000, backend="ray")
    b = pair("llama", 8001, backend="ray", master_port=29601)
    (err,) = errors_on("ai1", a, b)
    assert "[llama].ray_port = 6379" in err and "Ray head" in err and "e.g. 6380" in err
    assert errors_on("ai1", a, dict(b, ray_port=6380)) == []


def test_an_explicit_watchdog_port_collision_names_watchdog_port():
    a = pair("qwen", 8000)
    b = pair("llama", 8001, master_port=29601, watchdog_port=29512)
    (err,) = errors_on("ai2", a, b)
    assert "[llama].watchdog_port = 29512" in err


@pytest.mark.parametrize("state", ["absent"])
def test_an_absent_engine_claims_no_port(state):
    assert errors_on("ai1", pair("qwen", 8000), pair("old", 8001, state=state)) == []


def test_a_stopped_engine_still_claims_its_ports():
    # stopped engines are installed and may be started by hand: their ports stay theirs
    assert len(errors_on("ai1", pair("qwen", 8000), pair("spare", 8001, state="stopped"))) == 1


def test_the_same_api_port_is_said_once_by_the_api_port_check():
    errors = errors_on("ai1", engine(name="a", secrets=KEY), engine(name="b", secrets=KEY))
    assert len(errors) == 1 and "is already the port of engine a on this host" in errors[0]


def test_node_ports_of_each_rank():
    (rank0,) = vs.host_engines([pair("qwen", 8000)], "ai1", "mp")
    (rank1,) = vs.host_engines([pair("qwen", 8000)], "ai2", "mp")
    assert sorted(node_ports(rank0)) == [8000, 29501, 29511, 29512, 29513]
    assert sorted(node_ports(rank1)) == [29512]
    assert node_ports({"name": "x", "port": "8000"}) == {}  # not a port number: the engine's own check says so
