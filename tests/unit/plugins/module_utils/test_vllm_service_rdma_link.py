# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""service/rdma_link.py (issue 35 item 2): a multi-node engine's cluster link on a node, RDMA or TCP
sockets, from what uma.vllm.rdma_facts reads, and what it adds to the launcher config (env, the
``docker run`` words).

The facts are the real module logic's (system/rdma.py) over the sysfs trees of tests/unit/fixtures/rdma
(a DGX Spark pair node, a soft-RoCE rxe0), built under tmp_path by rdma_tree.py and changed per test;
the cluster address is given with its prefix so that no test depends on /proc/net/route's byte order.
"""

from __future__ import annotations

import os

import pytest
import rdma_tree
from ansible.errors import AnsibleFilterError

from ansible_collections.uma.vllm.plugins.filter import vllm_service as filters
from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import ranks as _ranks
from ansible_collections.uma.vllm.plugins.module_utils.service import engines as model
from ansible_collections.uma.vllm.plugins.module_utils.service import rdma_link
from ansible_collections.uma.vllm.plugins.module_utils.service.base import EngineModelError

SPARK_ADDR = "192.168.177.11/24"
RXE_ADDR = "192.168.122.10/24"
IFNAME = "enp1s0f1np1"
OPTIONS = ["--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]  # the role's default container options
ADDRS = {"ai1": "192.168.177.11"}
MP_TAIL = ("--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr", "192.168.177.11")
SETTINGS = {
    "runtime": "container",
    "container_engine": "docker",
    "container_bin": "/usr/bin/docker",
    "image": "nvcr.io/nvidia/vllm:26.02-py3",
    "container_command": None,
    "container_gpus": "all",
    "container_options": OPTIONS,
    "api_host": "0.0.0.0",
    "node_addr": "192.168.177.11",
    "ifnames": {"nccl": IFNAME, "gloo": IFNAME, "ucx": IFNAME},
}


@pytest.fixture
def spark(tmp_path):
    return rdma_tree.build(rdma_tree.SPARK, str(tmp_path))


@pytest.fixture
def rxe(tmp_path):
    return rdma_tree.build(rdma_tree.RXE, str(tmp_path))


def no_rdma(tmp_path):
    """A node without /sys/class/infiniband (the lab's VMs and containers)."""
    os.makedirs(str(tmp_path / "bare" / "sys" / "class" / "net"))
    os.makedirs(str(tmp_path / "bare" / "proc" / "net"))
    (tmp_path / "bare" / "proc" / "net" / "route").write_text("Iface\tDestination\n")
    return str(tmp_path / "bare" / "sys"), str(tmp_path / "bare" / "proc")


def put(sysfs_root, relative, content):
    path = os.path.join(sysfs_root, "class", "infiniband", relative)
    os.unlink(path)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content)


def tp2(host="ai1", **extra):
    engine = dict(
        {"name": "tp2", "nodes": ["ai1", "ai2"], "port": 8000, "model_path": "/m", "plan": {"tensor_parallel_size": 2}},
        **extra,
    )
    (found,) = model.host_engines([engine], host, "mp")
    return found


def settings(facts, **over):
    out = {"mode": "auto", "hcas": None, "gid_index": None, "facts": facts, "ifname": IFNAME,
           "runtime": "container", "container_options": OPTIONS}  # fmt: skip
    out.update(over)
    return out


def plan(tail=MP_TAIL):
    return {"argv": ["vllm", "serve", "/m", *tail], "env": {}, "budget": {"kv_cache_bytes": 1}}


def launch(engine, rdma_settings, **over):
    """The launcher config as the role computes it: the links first, then launch_config."""
    merged = dict(SETTINGS, **over)
    merged["links"] = rdma_link.links([engine], rdma_settings)
    return model.launch_config(engine, plan(), merged, ADDRS)


# ---- what the node has -------------------------------------------------------------------------


def test_a_spark_with_both_halves_of_its_cx7_port_on_the_link_uses_both(spark):
    link = rdma_link.link(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR)))
    assert link["transport"] == "rdma" and link["reason"] is None
    assert link["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"] and link["gid_index"] == 3
    assert link["env"] == {"NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "NCCL_IB_GID_INDEX": "3"}
    # the role's default options already unlimit memlock: only the devices and the capability are added
    assert link["container_options"] == ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK"]
    assert link["unused"] == [] and link["notes"] == []  # the f0 halves without a cable are not on the link
    lines = link["text"].split("\n")
    assert lines[0] == (
        "cluster link: RDMA (RoCE v2), NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1 (rdma_facts), NCCL_IB_GID_INDEX=3 "
        "(rdma_facts: 192.168.177.11 is RoCE v2 GID index 3 of rocep1s0f1 port 1 (netdev enp1s0f1np1))"
    )
    assert lines[1] == "  bootstrap: TCP sockets over enp1s0f1np1 (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME as before)"
    assert lines[2] == (
        "  container: --device /dev/infiniband --cap-add IPC_LOCK (memlock=-1 from vllm_service_container_options)"
    )
    link = rdma_link.link(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR), container_options=["--privileged"]))
    assert link["text"].split("\n")[2] == (
        "  container: --ulimit memlock=-1:-1 (the RDMA devices, IPC_LOCK from vllm_service_container_options)"
    )


def test_the_launcher_config_gets_the_env_and_the_container_words(spark):
    config = launch(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR), container_options=[]), container_options=[])
    env, command = config["env"], config["command"]
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and env["NCCL_IB_GID_INDEX"] == "3"
    # the socket interface stays for NCCL's and gloo's bootstrap
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == IFNAME
    for name in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX"):
        assert command[command.index(name) - 1] == "-e"  # the value from the launcher's environment
    image = command.index(SETTINGS["image"])
    words = ["--device", "/dev/infiniband", "--ulimit", "memlock=-1:-1", "--cap-add", "IPC_LOCK"]
    start = command.index("--device")
    assert command[start : start + len(words)] == words and start + len(words) <= image


def test_the_role_options_come_after_the_link_words(spark):
    config = launch(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR)))
    command = config["command"]
    assert command.index("--cap-add") < command.index("stack=67108864")
    assert command.count("--ulimit") == 2  # memlock=-1 of the role's options is not said twice


def test_the_native_runtime_adds_env_only(spark):
    link = rdma_link.link(tp2(runtime="native"), settings(rdma_tree.facts(*spark, SPARK_ADDR)))
    assert link["container_options"] == [] and link["env"]["NCCL_IB_GID_INDEX"] == "3"
    assert "  unit: LimitMEMLOCK=infinity (uma-vllm@.service)" in link["text"].split("\n")


def test_the_engine_unit_template_has_unlimited_locked_memory():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")
    with open(os.path.join(root, "roles", "vllm_service", "templates", "uma-vllm@.service.j2"), encoding="utf-8") as f:
        assert "\nLimitMEMLOCK=infinity\n" in f.read()


def test_a_node_with_one_hca(rxe):
    link = rdma_link.link(tp2(), settings(rdma_tree.facts(*rxe, RXE_ADDR), ifname="eth0"))
    assert (link["transport"], link["hcas"], link["gid_index"]) == ("rdma", ["rxe0"], 1)
    assert link["env"] == {"NCCL_IB_HCA": "rxe0", "NCCL_IB_GID_INDEX": "1"}


def test_a_node_without_rdma_keeps_todays_sockets_and_nothing_changes(tmp_path):
    facts = rdma_tree.facts(*no_rdma(tmp_path), "192.168.177.11/24")
    link = rdma_link.link(tp2(), settings(facts))
    assert link["transport"] == "tcp" and link["env"] == {} and link["container_options"] == []
    assert link["text"] == "cluster link: TCP sockets over enp1s0f1np1 (no RDMA devices on this node)"
    # the launcher config is the one of a role that knows nothing of RDMA
    before = model.launch_config(tp2(), plan(), SETTINGS, ADDRS)
    assert launch(tp2(), settings(facts)) == before
    assert "rdma" not in str(before).lower() and "infiniband" not in str(before)


def test_facts_not_read_is_tcp_sockets():
    link = rdma_link.link(tp2(), settings(None))
    assert link["transport"] == "tcp" and "were not read" in link["reason"]


def test_single_node_engines_have_no_link():
    (solo,) = model.host_engines([{"name": "solo", "port": 8000, "model_path": "/m"}], "ai1")
    assert rdma_link.link(solo, settings(None)) is None and rdma_link.links([solo], settings(None)) == {}


# ---- ports that are down, GIDs that differ -----------------------------------------------------


def test_a_twin_whose_port_is_down_is_not_used_and_said_why(spark):
    put(spark[0], "roceP2p1s0f1/ports/1/state", "1: DOWN\n")
    link = rdma_link.link(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR)))
    assert link["hcas"] == ["rocep1s0f1"] and link["env"]["NCCL_IB_HCA"] == "rocep1s0f1"
    assert link["unused"] == ["roceP2p1s0f1: not used, roceP2p1s0f1 port 1 is 1: DOWN, not ACTIVE"]
    assert "  roceP2p1s0f1: not used, roceP2p1s0f1 port 1 is 1: DOWN, not ACTIVE" in link["text"].split("\n")


def test_both_halves_down_is_tcp_with_the_reason_or_refused_when_rdma_is_required(spark):
    put(spark[0], "roceP2p1s0f1/ports/1/state", "1: DOWN\n")
    put(spark[0], "rocep1s0f1/ports/1/state", "1: DOWN\n")
    facts = rdma_tree.facts(*spark, SPARK_ADDR)
    link = rdma_link.link(tp2(), settings(facts))
    assert link["transport"] == "tcp" and link["env"] == {}
    assert "rocep1s0f1 port 1 is 1: DOWN, not ACTIVE" in link["reason"]
    assert "roceP2p1s0f1 port 1 is 1: DOWN" in link["text"] and link["text"].startswith("cluster link: TCP sockets")
    with pytest.raises(EngineModelError) as err:
        rdma_link.link(tp2(), settings(facts, mode=True))
    text = str(err.value)
    assert text.startswith("vllm_service_rdma = True but engine tp2 cannot use RDMA on this node")
    assert "DOWN" in text and "Fix:" in text and "vllm_service_rdma: auto" in text


def test_a_twin_without_a_roce_v2_gid_at_the_index_is_not_used(spark):
    put(spark[0], "roceP2p1s0f1/ports/1/gid_attrs/types/3", "IB/RoCE v1\n")
    link = rdma_link.link(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR)))
    assert link["hcas"] == ["rocep1s0f1"]
    assert link["unused"] == [
        "roceP2p1s0f1: not used, roceP2p1s0f1 has no RoCE v2 GID at index 3 (its RoCE v2 GIDs: 1), and "
        "NCCL_IB_GID_INDEX is one index for every HCA"
    ]


def test_an_address_on_no_rdma_device_is_tcp_with_rdma_facts_message(spark):
    link = rdma_link.link(tp2(), settings(rdma_tree.facts(*spark, "10.9.9.9/24")))
    assert link["transport"] == "tcp" and "no RDMA device carries 10.9.9.9" in link["reason"]


# ---- overrides ---------------------------------------------------------------------------------


def test_rdma_false_keeps_tcp_sockets_on_an_rdma_node(spark):
    facts = rdma_tree.facts(*spark, SPARK_ADDR)
    link = rdma_link.link(tp2(), settings(facts, mode=False))
    assert link["transport"] == "tcp" and link["reason"] == "RDMA turned off by vllm_service_rdma: false"
    link = rdma_link.link(tp2(rdma="false"), settings(facts, mode=True))
    assert link["reason"] == "RDMA turned off by vllm_service_engines[tp2].rdma: false"
    assert launch(tp2(), settings(facts, mode="no")) == model.launch_config(tp2(), plan(), SETTINGS, ADDRS)


def test_the_engine_overrides_the_hcas_and_the_gid_index(spark):
    facts = rdma_tree.facts(*spark, SPARK_ADDR)
    link = rdma_link.link(tp2(rdma_hcas=["rocep1s0f1"], rdma_gid_index=5), settings(facts))
    assert link["env"] == {"NCCL_IB_HCA": "rocep1s0f1", "NCCL_IB_GID_INDEX": "5"}
    assert "(vllm_service_engines[tp2].rdma_hcas)" in link["text"]
    assert "NCCL_IB_GID_INDEX=5 (vllm_service_engines[tp2].rdma_gid_index)" in link["text"]


def test_the_role_overrides_and_a_named_hca_that_is_down(spark):
    facts = rdma_tree.facts(*spark, SPARK_ADDR)
    link = rdma_link.link(tp2(), settings(facts, hcas="rocep1s0f1, rocep1s0f0", gid_index="3"))
    assert link["hcas"] == ["rocep1s0f1", "rocep1s0f0"] and link["gid_index"] == 3
    assert link["notes"] == [
        "rocep1s0f0 port 1 is 1: DOWN, not ACTIVE (named by vllm_service_rdma_hcas; NCCL skips a port that is not "
        "ACTIVE)"
    ]
    # the engine's own key wins over the role's
    link = rdma_link.link(tp2(rdma_hcas=["roceP2p1s0f1"]), settings(facts, hcas=["rocep1s0f1"]))
    assert link["hcas"] == ["roceP2p1s0f1"]


def test_a_gid_index_override_that_no_device_of_the_link_has_is_tcp_said_why(spark):
    link = rdma_link.link(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR), gid_index=5))
    assert link["transport"] == "tcp"
    assert "rocep1s0f1 has no RoCE v2 GID at index 5 (its RoCE v2 GIDs: 1, 3)" in link["reason"]
    # named HCAs are taken as named, with a note
    link = rdma_link.link(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR), hcas=["rocep1s0f1"], gid_index=5))
    assert link["transport"] == "rdma" and link["notes"][0].startswith("rocep1s0f1 has no RoCE v2 GID at index 5")


def test_a_gid_index_override_works_where_the_address_is_not_found(spark):
    facts = rdma_tree.facts(*spark, "10.9.9.9/24")
    link = rdma_link.link(tp2(), settings(facts, hcas=["rocep1s0f1"], gid_index=3))
    assert link["transport"] == "rdma" and link["env"]["NCCL_IB_GID_INDEX"] == "3"


BAD = [
    ({"mode": "maybe"}, {}, "vllm_service_rdma = 'maybe' is not auto, true or false. Fix: Use auto"),
    ({"mode": 1}, {}, "vllm_service_rdma = 1 is not auto, true or false"),
    ({}, {"rdma": "sometimes"}, "vllm_service_engines[tp2].rdma = 'sometimes' is not auto, true or false"),
    ({"hcas": ["mlx5_0; rm -rf /"]}, {}, "vllm_service_rdma_hcas = ['mlx5_0; rm -rf /'] has 'mlx5_0; rm -rf /'"),
    ({"hcas": "a\nb"}, {}, "vllm_service_rdma_hcas = 'a\\nb' has 'a\\nb', which is not an RDMA device name"),
    ({"hcas": 5}, {}, "vllm_service_rdma_hcas = 5 is not a list of RDMA device names. Fix: Give a list"),
    ({}, {"rdma_hcas": ["x", "x"]}, "vllm_service_engines[tp2].rdma_hcas = ['x', 'x'] names a device twice"),
    ({}, {"rdma_hcas": [None]}, "vllm_service_engines[tp2].rdma_hcas = [None] has None"),
    ({"gid_index": 256}, {}, "vllm_service_rdma_gid_index = 256 is not a GID index (a whole number from 0 to 255)"),
    ({"gid_index": -1}, {}, "vllm_service_rdma_gid_index = -1 is not a GID index"),
    ({"gid_index": True}, {}, "vllm_service_rdma_gid_index = True is not a GID index"),
    ({"gid_index": "3x"}, {}, "vllm_service_rdma_gid_index = '3x' is not a GID index"),
    ({"gid_index": 2.5}, {}, "vllm_service_rdma_gid_index = 2.5 is not a GID index"),
    ({}, {"rdma_gid_index": "1000"}, "vllm_service_engines[tp2].rdma_gid_index = '1000' is not a GID index"),
]


@pytest.mark.parametrize("role, engine, message", BAD)
def test_bad_overrides_are_refused_naming_the_option_the_value_and_the_fix(spark, role, engine, message):
    rdma_settings = settings(rdma_tree.facts(*spark, SPARK_ADDR), **role)
    # before anything is read from the node: the engine check of the role's first task
    errors = model.check([tp2(**engine)], {"runtime": "native", "rdma": rdma_settings}, ["ai1", "ai2"], ADDRS)
    assert any(e.startswith(message) and "Fix: " in e for e in errors), errors
    # and the links filter, as the role calls it: AnsibleFilterError with the same text, no traceback
    with pytest.raises(AnsibleFilterError) as err:
        filters.rdma_links([tp2(**engine)], rdma_settings)
    assert message in str(err.value)


def test_an_hca_that_is_not_on_the_node_is_refused_naming_the_devices_there(spark):
    with pytest.raises(EngineModelError) as err:
        rdma_link.link(tp2(), settings(rdma_tree.facts(*spark, SPARK_ADDR), hcas=["mlx5_0"]))
    assert str(err.value) == (
        "vllm_service_rdma_hcas = ['mlx5_0'] names mlx5_0, not an RDMA device of this node (it has roceP2p1s0f0, "
        "roceP2p1s0f1, rocep1s0f0, rocep1s0f1). Fix: Name devices of /sys/class/infiniband on this node, or leave "
        "it null to take them from uma.vllm.rdma_facts."
    )


def test_rdma_required_on_a_node_without_rdma_is_refused(tmp_path):
    with pytest.raises(EngineModelError, match=r"^vllm_service_rdma = True but engine tp2 cannot use RDMA on this "
                       r"node: no RDMA devices on this node\. Fix: "):  # fmt: skip
        rdma_link.link(tp2(), settings(rdma_tree.facts(*no_rdma(tmp_path), None), mode="yes"))


def test_the_engine_env_may_not_set_what_the_link_owns():
    errors = rdma_link.settings_errors([tp2(env={"NCCL_IB_HCA": "mlx5"})], settings(None))
    assert errors == [
        "vllm_service_engines[tp2].env.NCCL_IB_HCA = 'mlx5' is set by the role from uma.vllm.rdma_facts on a "
        "multi-node engine. Fix: Drop it from env; give the engine rdma_hcas / rdma_gid_index (or the role's "
        "vllm_service_rdma_hcas / vllm_service_rdma_gid_index) to override what the node shows."
    ]
    (solo,) = model.host_engines([{"name": "solo", "port": 1, "model_path": "/m", "env": {"NCCL_IB_HCA": "x"}}], "a")
    assert rdma_link.settings_errors([solo], settings(None)) == []  # a single-node engine has no link


def test_good_overrides_pass_the_check():
    rdma_settings = settings(None, mode="auto", hcas=["rocep1s0f1", "roceP2p1s0f1"], gid_index=3)
    assert rdma_link.settings_errors([tp2(rdma=True, rdma_gid_index="7")], rdma_settings) == []
    assert rdma_link.settings_errors([], settings(None, mode=None, hcas="", gid_index="")) == []


# ---- what is written ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, words",
    [
        ([], ["--device", "/dev/infiniband", "--ulimit", "memlock=-1:-1", "--cap-add", "IPC_LOCK"]),
        (["--ulimit=memlock=-1:-1", "--cap-add=ipc_lock"], ["--device", "/dev/infiniband"]),
        (["--device", "/dev/infiniband:/dev/infiniband", "--cap-add", "CAP_IPC_LOCK", "--ulimit", "memlock=-1"], []),
        (["--privileged", "--ulimit", "memlock=-1"], []),
    ],
)
def test_container_words_leave_out_what_the_role_options_give(options, words):
    assert rdma_link.container_words(options, "tp2") == words


def test_a_finite_memlock_in_the_role_options_is_refused():
    with pytest.raises(EngineModelError, match=r"^vllm_service_container_options = .* limit locked memory to 65536"):
        rdma_link.container_words(["--ulimit", "memlock=65536"], "tp2")


@pytest.mark.parametrize(
    "junk",
    [
        {"env": {"LD_PRELOAD": "/x.so"}, "container_options": []},
        {"env": {"NCCL_IB_HCA": "a b"}, "container_options": []},
        {"env": {"NCCL_IB_GID_INDEX": "300"}, "container_options": []},
        {"env": {}, "container_options": ["--privileged"]},
        "rdma",
    ],
)
def test_a_link_that_the_filter_did_not_make_is_refused_where_it_is_written(junk):
    with pytest.raises(EngineModelError, match=r"^links\[tp2\] = .*Fix: Pass what the filter"):
        model.launch_config(tp2(), plan(), dict(SETTINGS, links={"tp2": junk}), ADDRS)


def test_the_ranks_compare_their_configs_without_the_per_node_gid_index(spark):
    """The GID index is where each node's kernel put the address: rank 0's 3 and rank 1's 5 are one engine."""
    facts = rdma_tree.facts(*spark, SPARK_ADDR)
    rank0 = launch(tp2(), settings(facts))
    rank1 = launch(tp2(), settings(facts, hcas=["rocep1s0f1", "roceP2p1s0f1"], gid_index=5))
    assert rank0["env"]["NCCL_IB_GID_INDEX"] != rank1["env"]["NCCL_IB_GID_INDEX"]
    config = {"engine": "tp2", "command": rank0["command"], "env": rank0["env"]}
    other = {"engine": "tp2", "command": rank1["command"], "env": rank1["env"]}
    assert _ranks.fingerprint(config)[0] == _ranks.fingerprint(other)[0]
