# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma.vllm.rdma_facts through main(): the fact, check mode, warnings, refusals.

The logic's own tests are in tests/unit/plugins/module_utils/test_rdma_facts.py; the sysfs trees in
tests/unit/fixtures/rdma.
"""

from __future__ import annotations

import os
import sys

import pytest
from ansible.module_utils import basic

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
import rdma_tree

from ansible_collections.uma.vllm.plugins.modules import rdma_facts


@pytest.fixture
def spark(tmp_path):
    return rdma_tree.build(rdma_tree.SPARK, str(tmp_path))


@pytest.fixture
def warnings(monkeypatch):
    seen = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: seen.append(text))
    return seen


@pytest.mark.parametrize("check_mode", [False, True])
def test_spark_node_fact(run_module, spark, check_mode):
    sysfs_root, proc_root = spark
    args = {"sysfs_root": sysfs_root, "proc_root": proc_root, "cluster_addr": "192.168.177.11/24"}
    before = sorted(os.walk(os.path.dirname(sysfs_root)))
    failed, result = run_module(rdma_facts, args, check_mode=check_mode)
    assert not failed and result["changed"] is False
    fact = result["ansible_facts"]["uma_rdma"]
    assert (
        fact["present"]
        and fact["cluster"]["gid_index"] == 3
        and fact["cluster"]["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"]
    )
    assert fact["summary"].endswith("192.168.177.11 is RoCE v2 GID index 3 of rocep1s0f1 port 1 (netdev enp1s0f1np1)")
    assert sorted(os.walk(os.path.dirname(sysfs_root))) == before  # read-only


def test_defaults_and_no_cluster_addr(run_module, spark):
    sysfs_root, _proc = spark
    failed, result = run_module(rdma_facts, {"sysfs_root": sysfs_root})
    assert not failed and result["ansible_facts"]["uma_rdma"]["cluster"] is None


def test_node_without_rdma(run_module, tmp_path):
    (tmp_path / "class" / "net").mkdir(parents=True)
    failed, result = run_module(rdma_facts, {"sysfs_root": str(tmp_path), "cluster_addr": "10.0.0.1"})
    fact = result["ansible_facts"]["uma_rdma"]
    assert not failed and fact["devices"] == [] and fact["summary"].startswith("no RDMA devices (TCP sockets)")
    assert fact["cluster"]["found"] is False


def test_warnings_are_task_warnings(run_module, spark, warnings):
    sysfs_root, proc_root = spark
    mtu = os.path.join(sysfs_root, "class/net/enP2p1s0f1np1/mtu")
    os.unlink(os.path.realpath(mtu))
    with open(os.path.realpath(mtu), "w") as handle:
        handle.write("1500\n")
    failed, result = run_module(
        rdma_facts, {"sysfs_root": sysfs_root, "proc_root": proc_root, "cluster_addr": "192.168.177.11/24"}
    )
    assert not failed
    assert warnings == result["ansible_facts"]["uma_rdma"]["warnings"] and "different MTUs" in warnings[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"cluster_addr": "192.168.177"}, "option 'cluster_addr' = '192.168.177': is not an IPv4 address"),
        ({"cluster_addr": "fe80::1"}, "option 'cluster_addr' = 'fe80::1': is an IPv6 address"),
        ({"cluster_addr": "192.168.177.11/40"}, "has a prefix length that is not a whole number 1-32"),
        ({"sysfs_root": "/"}, "option 'sysfs_root' = '/': has no class/ directory"),
        ({"sysfs_root": "sys"}, "option 'sysfs_root' = 'sys': is not an absolute path"),
    ],
)
def test_refusals_name_option_value_and_fix(run_module, spark, args, expected):
    sysfs_root, proc_root = spark
    full = dict({"sysfs_root": sysfs_root, "proc_root": proc_root}, **args)
    failed, result = run_module(rdma_facts, full)
    assert failed and expected in result["msg"]
    assert "Give " in result["msg"]
