# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""system/rdma.py: the RDMA devices read from sysfs and the RoCE v2 GID index of the cluster address.

The trees are tests/unit/fixtures/rdma (a DGX Spark pair node reconstructed from public sources, and a
soft-RoCE rxe0 as the kernel writes it; README.md there says where each value comes from), built under
tmp_path by rdma_tree.py, then damaged or changed per test. The module through main() is in
tests/unit/plugins/modules/test_rdma_facts_module.py.
"""

from __future__ import annotations

import os
import sys

import pytest
import rdma_tree

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.system import rdma

SPARK_DEV = "devices/pci0000:00/0000:00:00.0/0000:01:00.1"
SPARK_TWIN = "devices/pci0002:00/0002:00:00.0/0002:01:00.1"
LITTLE = sys.byteorder == "little"  # the fixtures' /proc/net/route was written as a little-endian kernel does


facts = rdma_tree.facts


@pytest.fixture
def spark(tmp_path):
    return rdma_tree.build(rdma_tree.SPARK, str(tmp_path))


@pytest.fixture
def rxe(tmp_path):
    return rdma_tree.build(rdma_tree.RXE, str(tmp_path))


def put(path, content):
    """Replace a file of the tree (text or bytes)."""
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "wb" if isinstance(content, bytes) else "w") as handle:
        handle.write(content)


def by_name(result):
    return {device["name"]: device for device in result["devices"]}


# ---- the fixtures, parsed ----------------------------------------------------------------------


def test_spark_pair_node_devices(spark):
    result = facts(*spark)
    devices = by_name(result)
    assert [d["name"] for d in result["devices"]] == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]
    assert result["present"] and result["active_ports"] == 2 and result["notes"] == [] and result["cluster"] is None
    assert result["summary"] == (
        "4 RDMA devices (rocep1s0f0, rocep1s0f1, roceP2p1s0f0, roceP2p1s0f1), 2 of 4 ports ACTIVE"
    )
    up = devices["rocep1s0f1"]
    assert up["node_type"] == "1: CA" and up["node_guid"] == "0200:0003:0000:1a17"
    assert up["sys_image_guid"] == devices["roceP2p1s0f1"]["sys_image_guid"] == "0200:0003:0000:1a16"
    assert up["netdevs"] == ["enp1s0f1np1"] and up["parent"] is None
    assert up["pci"] == {"domain": 0, "bus": 1, "slot": 0, "function": 1}
    assert devices["roceP2p1s0f1"]["pci"] == {"domain": 2, "bus": 1, "slot": 0, "function": 1}
    (port,) = up["ports"]
    assert port == dict(
        port,
        port=1,
        state="4: ACTIVE",
        state_name="ACTIVE",
        active=True,
        phys_state="5: LinkUp",
        rate="200 Gb/sec (2X NDR)",
        rate_gbps=200.0,
        link_layer="Ethernet",
        netdev="enp1s0f1np1",
        netdev_source="gid_attrs/ndevs/0",
        mtu=9000,
        operstate="up",
        ipv4=["192.168.177.11"],
    )
    assert [(g["index"], g["type"], g["ipv4"]) for g in port["gids"]] == [
        (0, "IB/RoCE v1", None),
        (1, "RoCE v2", None),
        (2, "IB/RoCE v1", "192.168.177.11"),
        (3, "RoCE v2", "192.168.177.11"),
    ]
    assert port["gids"][3]["gid"] == "0000:0000:0000:0000:0000:ffff:c0a8:b10b"
    assert all(g["netdev"] == "enp1s0f1np1" for g in port["gids"])


def test_spark_pair_node_down_ports_without_cable(spark):
    (port,) = by_name(facts(*spark))["rocep1s0f0"]["ports"]
    assert (port["state"], port["state_name"], port["active"], port["phys_state"]) == (
        "1: DOWN",
        "DOWN",
        False,
        "3: Disabled",
    )
    assert (port["rate"], port["rate_gbps"], port["mtu"], port["operstate"]) == (
        "40 Gb/sec (4X QDR)",
        40.0,
        1500,
        "down",
    )
    assert port["ipv4"] == [] and [g["index"] for g in port["gids"]] == [0, 1]


def test_soft_roce_rxe0(rxe):
    result = facts(*rxe)
    (device,) = result["devices"]
    assert device["name"] == "rxe0" and device["node_type"] == "1: CA" and device["parent"] == "eth0"
    assert device["node_guid"] == "5054:00ff:fe12:3456" and device["pci"] is None and device["netdevs"] == []
    (port,) = device["ports"]
    assert (port["state"], port["phys_state"], port["rate"], port["rate_gbps"], port["link_layer"]) == (
        "4: ACTIVE",
        "5: LinkUp",
        "10 Gb/sec (1X FDR10)",
        10.0,
        "Ethernet",
    )
    assert (port["netdev"], port["mtu"], port["operstate"]) == ("eth0", 1500, "up")
    # rxe is RoCE v2 only (rxe_port_immutable: RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP)
    assert [(g["index"], g["type"], g["ipv4"]) for g in port["gids"]] == [
        (0, "RoCE v2", None),
        (1, "RoCE v2", "192.168.122.10"),
    ]
    assert result["summary"] == "1 RDMA device (rxe0), 1 of 1 port ACTIVE" and result["notes"] == []


def test_rxe_netdev_from_parent_when_the_gids_do_not_name_it(rxe):
    sysfs_root, proc_root = rxe
    port_dir = os.path.join(sysfs_root, "class/infiniband/rxe0/ports/1")
    for index in ("0", "1"):
        os.unlink(os.path.join(port_dir, "gid_attrs/ndevs", index))
    (port,) = facts(sysfs_root, proc_root)["devices"][0]["ports"]
    assert (port["netdev"], port["netdev_source"], port["mtu"]) == ("eth0", "parent", 1500)


def test_no_infiniband_directory_is_tcp_not_an_error(tmp_path):
    (tmp_path / "sys" / "class" / "net").mkdir(parents=True)
    result = facts(str(tmp_path / "sys"), str(tmp_path / "proc"))
    assert result["devices"] == [] and not result["present"] and result["notes"] == []
    assert result["summary"] == rdma.NO_RDMA == "no RDMA devices (TCP sockets)"


def test_no_infiniband_directory_with_a_cluster_address(tmp_path):
    (tmp_path / "sys" / "class").mkdir(parents=True)
    result = facts(str(tmp_path / "sys"), str(tmp_path / "proc"), "192.168.177.11/24")
    assert result["summary"].startswith("no RDMA devices (TCP sockets); no RDMA device carries 192.168.177.11")
    assert result["cluster"]["found"] is False and result["cluster"]["gid_index"] is None


# ---- the cluster address -----------------------------------------------------------------------


@pytest.mark.parametrize("cluster_addr", ["192.168.177.11/24", "192.168.177.11"])
def test_gid_index_of_the_cluster_address(spark, cluster_addr):
    if "/" not in cluster_addr and not LITTLE:
        pytest.skip("the fixture's /proc/net/route is little-endian")
    cluster = facts(*spark, cluster_addr=cluster_addr)["cluster"]
    assert {k: cluster[k] for k in ("found", "gid_index", "device", "port", "netdev", "gid")} == {
        "found": True,
        "gid_index": 3,
        "device": "rocep1s0f1",
        "port": 1,
        "netdev": "enp1s0f1np1",
        "gid": "0000:0000:0000:0000:0000:ffff:c0a8:b10b",
    }
    assert cluster["message"] == "192.168.177.11 is RoCE v2 GID index 3 of rocep1s0f1 port 1 (netdev enp1s0f1np1)"
    assert (cluster["prefix"], cluster["subnet"], cluster["devices_basis"]) == (24, "192.168.177.0/24", "subnet")
    if "/" in cluster_addr:
        assert cluster["subnet_source"] == "cluster_addr"
    else:
        assert cluster["subnet_source"].startswith("the route through enp1s0f1np1 in ")
    assert [(e["device"], e["ipv4"]) for e in cluster["devices"]] == [("rocep1s0f1", ["192.168.177.11"])]
    assert cluster["warnings"] == []


def test_the_other_pcie_half_is_the_twin_and_both_are_hcas(spark):
    cluster = facts(*spark, cluster_addr="192.168.177.11/24")["cluster"]
    assert [(t["device"], t["netdev"], t["active"], t["mtu"], t["ipv4"]) for t in cluster["twins"]] == [
        ("roceP2p1s0f1", "enP2p1s0f1np1", True, 9000, ["192.168.178.11"])
    ]
    assert cluster["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"]
    # and the other way round: the second half's address finds the first half as its twin
    other = facts(*spark, cluster_addr="192.168.178.11/24")["cluster"]
    assert (other["device"], other["gid_index"], [t["device"] for t in other["twins"]]) == (
        "roceP2p1s0f1",
        3,
        ["rocep1s0f1"],
    )


def test_both_halves_on_one_subnet_are_both_cluster_devices(spark):
    # NVIDIA's playbook gives both halves link-local addresses: one /16, both halves on it
    cluster = facts(*spark, cluster_addr="192.168.177.11/16")["cluster"]
    assert [(e["device"], e["ipv4"]) for e in cluster["devices"]] == [
        ("rocep1s0f1", ["192.168.177.11"]),
        ("roceP2p1s0f1", ["192.168.178.11"]),
    ]
    assert cluster["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"]


def test_without_a_subnet_every_device_is_listed(spark):
    sysfs_root, proc_root = spark
    os.unlink(os.path.join(proc_root, "net", "route"))
    result = facts(sysfs_root, proc_root, "192.168.177.11")
    cluster = result["cluster"]
    assert cluster["found"] and cluster["gid_index"] == 3
    assert (cluster["prefix"], cluster["subnet"], cluster["devices_basis"]) == (
        None,
        None,
        "all (the subnet is unknown)",
    )
    assert [e["device"] for e in cluster["devices"]] == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]
    assert result["notes"] == [
        "%s: cannot be read (No such file or directory): the cluster link's subnet is unknown"
        % os.path.join(proc_root, "net", "route")
    ]


def test_address_not_found_says_what_is_there_and_what_to_do(spark):
    result = facts(*spark, cluster_addr="10.0.0.5/24")
    cluster = result["cluster"]
    assert (cluster["found"], cluster["gid_index"], cluster["device"], cluster["netdev"]) == (False, None, None, None)
    message = cluster["message"]
    assert message.startswith("no RDMA device carries 10.0.0.5: no GID is ::ffff:10.0.0.5")
    assert "0000:0000:0000:0000:0000:ffff:0a00:0005" in message
    assert "enp1s0f1np1 192.168.177.11" in message and "enP2p1s0f1np1 192.168.178.11" in message
    assert "give cluster_addr the address that is there" in message
    assert cluster["devices"] == [] and cluster["twins"] == [] and cluster["hcas"] == []
    assert message in result["summary"]


def test_address_only_as_roce_v1_is_not_taken(spark):
    sysfs_root, proc_root = spark
    put(os.path.join(sysfs_root, "class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3"), "IB/RoCE v1\n")
    cluster = facts(sysfs_root, proc_root, "192.168.177.11/24")["cluster"]
    assert not cluster["found"] and cluster["gid_index"] is None
    assert cluster["message"].startswith(
        "192.168.177.11 is in the GID table of rocep1s0f1 port 1 (index 2) only as type IB/RoCE v1, not RoCE v2"
    )


def test_a_down_port_with_the_address_is_a_warning(spark):
    sysfs_root, proc_root = spark
    port_dir = os.path.join(sysfs_root, "class/infiniband/rocep1s0f1/ports/1")
    put(os.path.join(port_dir, "state"), "1: DOWN\n")
    put(os.path.join(port_dir, "phys_state"), "3: Disabled\n")
    put(os.path.join(sysfs_root, SPARK_DEV, "net/enp1s0f1np1/operstate"), "down\n")
    result = facts(sysfs_root, proc_root, "192.168.177.11/24")
    (port,) = by_name(result)["rocep1s0f1"]["ports"]
    assert (port["active"], port["state_name"], port["phys_state"]) == (False, "DOWN", "3: Disabled")
    assert result["active_ports"] == 1 and "1 of 4 ports ACTIVE" in result["summary"]
    assert result["cluster"]["gid_index"] == 3  # still where it is
    assert result["warnings"] == [
        "rocep1s0f1 port 1 carries 192.168.177.11 but its state is 1: DOWN, not ACTIVE: RDMA over it fails until "
        "the link is up",
        "netdev enp1s0f1np1 of rocep1s0f1 is down, not up",
    ]


def test_a_down_twin_is_a_warning_and_not_an_hca(spark):
    sysfs_root, proc_root = spark
    put(os.path.join(sysfs_root, "class/infiniband/roceP2p1s0f1/ports/1/state"), "1: DOWN\n")
    cluster = facts(sysfs_root, proc_root, "192.168.177.11/24")["cluster"]
    assert cluster["hcas"] == ["rocep1s0f1"]
    assert cluster["warnings"] == [
        "roceP2p1s0f1, the other PCIe half of rocep1s0f1's port, is 1: DOWN: RDMA gets half the port's bandwidth"
    ]


def test_mismatched_mtu_between_the_halves_is_a_warning(spark):
    sysfs_root, proc_root = spark
    put(os.path.join(sysfs_root, SPARK_TWIN, "net/enP2p1s0f1np1/mtu"), "1500\n")
    result = facts(sysfs_root, proc_root, "192.168.177.11/24")
    assert [t["mtu"] for t in result["cluster"]["twins"]] == [1500]
    assert result["warnings"] == [
        "the cluster link's RDMA netdevs have different MTUs (enP2p1s0f1np1 1500, enp1s0f1np1 9000): set one MTU "
        "on all of them (9000 on a DGX Spark pair), on both nodes"
    ]


def test_the_same_address_on_two_devices_is_a_warning(spark):
    sysfs_root, proc_root = spark
    twin_port = os.path.join(sysfs_root, "class/infiniband/roceP2p1s0f1/ports/1")
    put(os.path.join(twin_port, "gids/3"), "0000:0000:0000:0000:0000:ffff:c0a8:b10b\n")
    cluster = facts(sysfs_root, proc_root, "192.168.177.11/24")["cluster"]
    assert cluster["device"] == "rocep1s0f1"
    assert "192.168.177.11 is also a RoCE v2 GID of roceP2p1s0f1 port 1 index 3" in cluster["warnings"][0]


def test_rxe_cluster_address(rxe):
    cluster = facts(*rxe, cluster_addr="192.168.122.10/24")["cluster"]
    assert (cluster["gid_index"], cluster["device"], cluster["netdev"], cluster["twins"], cluster["hcas"]) == (
        1,
        "rxe0",
        "eth0",
        [],
        ["rxe0"],
    )


# ---- malformed sysfs files: a note naming the file, never a traceback ---------------------------


@pytest.mark.parametrize(
    ("relative", "content", "problem", "field", "value"),
    [
        ("ports/1/rate", "", "is empty", "rate", None),
        ("ports/1/rate", "fast\n", "'fast' is not '<n> Gb/sec (<w>X <speed>)'", "rate_gbps", None),
        ("ports/1/state", "ACTIVE\n", "'ACTIVE' is not '<number>: <NAME>'", "active", False),
        ("ports/1/state", b"4: ACT\xffIVE\n", "is not UTF-8 text", "state", None),
        ("ports/1/phys_state", b"5\x00\n", "holds NUL bytes, not text", "phys_state", None),
        ("ports/1/link_layer", None, "missing", "link_layer", None),
    ],
)
def test_malformed_port_files(spark, relative, content, problem, field, value):
    sysfs_root, proc_root = spark
    path = os.path.join(sysfs_root, "class/infiniband/rocep1s0f1", relative)
    if content is None:
        os.unlink(path)
    else:
        put(path, content)
    result = facts(sysfs_root, proc_root, "192.168.177.11/24")
    (port,) = by_name(result)["rocep1s0f1"]["ports"]
    assert port[field] == value
    assert result["notes"] == ["%s: %s" % (path, problem)]
    assert "1 sysfs file could not be read as expected (see notes)" in result["summary"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [("abc\n", "'abc' is not a whole number"), ("", "is empty"), ("-1\n", "'-1' is not a whole number")],
)
def test_malformed_mtu(spark, content, problem):
    sysfs_root, proc_root = spark
    path = os.path.join(sysfs_root, SPARK_DEV, "net/enp1s0f1np1/mtu")
    put(path, content)
    result = facts(sysfs_root, proc_root, "192.168.177.11/24")
    assert by_name(result)["rocep1s0f1"]["ports"][0]["mtu"] is None
    assert result["notes"] == ["%s: %s" % (os.path.join(sysfs_root, "class/net/enp1s0f1np1/mtu"), problem)]
    assert result["cluster"]["found"] and result["warnings"] == []  # an unknown MTU is no mismatch


def test_unreadable_files(spark):
    sysfs_root, proc_root = spark
    port_dir = os.path.join(sysfs_root, "class/infiniband/rocep1s0f1/ports/1")
    os.unlink(os.path.join(port_dir, "rate"))
    os.mkdir(os.path.join(port_dir, "rate"))  # a directory in place of the file
    os.unlink(os.path.join(port_dir, "phys_state"))
    os.symlink("phys_state", os.path.join(port_dir, "phys_state"))  # a link to itself
    put(os.path.join(port_dir, "gids/2"), "zzzz\n")
    result = facts(sysfs_root, proc_root, "192.168.177.11/24")
    (port,) = by_name(result)["rocep1s0f1"]["ports"]
    assert port["rate"] is None and port["phys_state"] is None and [g["index"] for g in port["gids"]] == [0, 1, 3]
    assert result["notes"] == [
        "%s/rate: is not a regular file" % port_dir,
        "%s/gids/2: 'zzzz' is not a GID (8 groups of 4 hex digits)" % port_dir,
        "%s/phys_state: cannot be read (Too many levels of symbolic links)" % port_dir,
    ]
    assert result["cluster"]["gid_index"] == 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_file_without_read_permission(spark):
    sysfs_root, proc_root = spark
    path = os.path.join(sysfs_root, "class/infiniband/rocep1s0f1/ports/1/rate")
    os.chmod(os.path.realpath(path), 0)
    result = facts(sysfs_root, proc_root)
    assert result["notes"] == ["%s: cannot be read (Permission denied)" % path]


def test_damaged_directories(spark):
    sysfs_root, proc_root = spark
    device = os.path.join(sysfs_root, "class/infiniband/roceP2p1s0f0")
    os.rename(os.path.join(device, "ports"), os.path.join(device, "ports.gone"))
    put(os.path.join(device, "ports"), "a file where the ports directory was\n")
    os.mkdir(os.path.join(sysfs_root, "class/infiniband/rocep1s0f1/ports/port one"))
    result = facts(sysfs_root, proc_root)
    assert by_name(result)["roceP2p1s0f0"]["ports"] == []
    assert result["notes"] == [  # in the order the devices are read
        "%s: left out a port: 'port one'" % os.path.join(sysfs_root, "class/infiniband/rocep1s0f1/ports"),
        "%s/ports: cannot be listed (Not a directory)" % device,
        "%s/ports: no ports (missing, empty or unreadable)" % device,
    ]


def test_infiniband_is_a_file(tmp_path):
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "infiniband").write_text("not a directory\n")
    result = facts(str(tmp_path), str(tmp_path / "proc"))
    assert result["devices"] == [] and result["summary"].startswith(rdma.NO_RDMA)
    assert result["notes"] == ["%s: is not a directory" % (tmp_path / "class" / "infiniband")]


# ---- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("192.168.1", "is not an IPv4 address"),
        ("300.1.1.1", "is not an IPv4 address"),
        ("192.168.177.011", "is not an IPv4 address"),
        ("spark1", "is not an IPv4 address"),
        ("192.168.177.11 ", None),  # surrounding blanks are fine
        ("fe80::1", "is an IPv6 address"),
        ("192.168.177.11/33", "has a prefix length that is not a whole number 1-32"),
        ("192.168.177.11/0", "has a prefix length that is not a whole number 1-32"),
        ("192.168.177.11/x", "has a prefix length that is not a whole number 1-32"),
        ("192.168.177.11/\u0662\u0664", "has a prefix length that is not a whole number 1-32"),
        ("0.0.0.0", "cannot be the address of a network interface"),
        ("224.0.0.1", "cannot be the address of a network interface"),
        ("255.255.255.255", "cannot be the address of a network interface"),
        ("a\nb", "is not an IPv4 address"),
        (5, "is not a string"),
    ],
)
def test_cluster_addr_refusals_name_the_option_value_and_fix(value, problem):
    if problem is None:
        assert rdma.check_cluster_addr(value) == ("192.168.177.11", None)
        return
    with pytest.raises(UmaError) as err:
        rdma.check_cluster_addr(value)
    assert err.value.message.startswith("option 'cluster_addr' = %r: %s" % (value, problem))
    assert err.value.message.endswith(rdma.CLUSTER_ADDR_FIX)


@pytest.mark.parametrize("value", [None, "", "  "])
def test_cluster_addr_left_out(value):
    assert rdma.check_cluster_addr(value) is None


def test_cluster_addr_with_prefix():
    assert rdma.check_cluster_addr("10.20.0.11/24") == ("10.20.0.11", 24)


def test_sysfs_root_refusals(tmp_path):
    with pytest.raises(UmaError, match="option 'sysfs_root' = 'relative': is not an absolute path"):
        rdma.check_request({"sysfs_root": "relative", "proc_root": "/proc"})
    with pytest.raises(UmaError, match=r"is not a directory\. Give the root of sysfs, /sys"):
        rdma.check_request({"sysfs_root": str(tmp_path / "nowhere"), "proc_root": "/proc"})
    with pytest.raises(UmaError, match="has no class/ directory: it is not the root of sysfs"):
        rdma.check_request({"sysfs_root": str(tmp_path), "proc_root": "/proc"})
    with pytest.raises(UmaError, match="option 'proc_root'"):
        (tmp_path / "class").mkdir()
        rdma.check_request({"sysfs_root": str(tmp_path), "proc_root": "proc"})


# ---- the small parts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "gid"),
    [
        ("192.168.100.11", "0000:0000:0000:0000:0000:ffff:c0a8:640b"),
        ("10.0.0.1", "0000:0000:0000:0000:0000:ffff:0a00:0001"),
        ("169.254.3.4", "0000:0000:0000:0000:0000:ffff:a9fe:0304"),
    ],
)
def test_ipv4_mapped_gid_both_ways(address, gid):
    assert rdma.mapped_gid(address) == gid and rdma.gid_ipv4(gid) == address
    assert rdma.gid_ipv4("fe80:0000:0000:0000:0000:00ff:fe00:1a17") is None


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("200 Gb/sec (2X NDR)", 200.0),
        ("200 Gb/sec (4X HDR)", 200.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("10 Gb/sec (1X FDR10)", 10.0),
        ("40 Gb/sec (4X QDR)", 40.0),
        ("200 Gb/s", None),
        (None, None),
    ],
)
def test_parse_rate(text, gbps):
    assert rdma.parse_rate(text) == gbps


@pytest.mark.parametrize(
    ("name", "link", "location"),
    [
        ("rocep1s0f1", None, (0, 1, 0, 1)),
        ("roceP2p1s0f1", None, (2, 1, 0, 1)),
        ("whatever", "/sys/devices/pci0002:00/0002:00:00.0/0002:01:00.1", (2, 1, 0, 1)),
        ("mlx5_0", "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0", (0, 0x3B, 0, 0)),
        ("mlx5_0", None, None),
        ("rxe0", None, None),
    ],
)
def test_pci_location(name, link, location):
    found = rdma.pci_location(name, link)
    assert (None if found is None else tuple(found[k] for k in ("domain", "bus", "slot", "function"))) == location


def test_twins_need_the_same_sys_image_guid(spark):
    sysfs_root, proc_root = spark
    put(os.path.join(sysfs_root, "class/infiniband/roceP2p1s0f1/sys_image_guid"), "0200:0003:0000:9999\n")
    assert facts(sysfs_root, proc_root, "192.168.177.11/24")["cluster"]["twins"] == []


@pytest.mark.skipif(not LITTLE, reason="the route table below is written as a little-endian kernel does")
def test_route_prefix_takes_the_longest_connected_route(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"  # default route: not the subnet
        "eth1\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n"  # 10.0.0.0/8
        "eth2\t0000140A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # 10.20.0.0/24
        "eth3\t0000140A\t0100140A\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0\n"  # 10.20.0.0/16 via a gateway
        "junk line\n"
    )
    reader = rdma.Reader()
    assert rdma.route_prefix(str(tmp_path), "10.20.0.11", None, reader) == (24, "eth2")
    assert rdma.route_prefix(str(tmp_path), "10.9.0.1", None, reader) == (8, "eth1")
    assert rdma.route_prefix(str(tmp_path), "172.16.0.1", None, reader) is None
    assert reader.notes == []
