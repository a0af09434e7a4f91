#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_facts
short_description: Report the node's RDMA devices and the RoCE v2 GID index of its cluster address, from sysfs
version_added: 0.1.0
description:
  - Reads every RDMA device in C(/sys/class/infiniband) the way the kernel's RDMA core writes it, with no
    vendor tool (no C(ibv_devinfo), C(show_gids) or C(ibdev2netdev)), and sets the fact C(uma_rdma).
  - >-
    Per device its name, C(node_type), C(node_guid) and C(sys_image_guid); per port its C(state)
    (C(4: ACTIVE)), C(phys_state), C(rate) (C(200 Gb/sec) at C(2X NDR)), C(link_layer) (C(Ethernet) for
    RoCE), the netdev it is bound to (from C(gid_attrs/ndevs), else the soft-RoCE C(parent) file, else
    C(device/net)), that netdev's MTU and C(operstate), and the GID table entries that hold a GID
    (C(gids/<i>) with C(gid_attrs/types/<i>), C(RoCE v2) or C(IB/RoCE v1), and C(gid_attrs/ndevs/<i>)).
  - With O(cluster_addr), the RoCE v2 GID index whose GID is the IPv4-mapped form of that address
    (C(::ffff:a.b.c.d), in sysfs C(0000:0000:0000:0000:0000:ffff:c0a8:b10b)) and its device, port and
    netdev, the value of C(NCCL_IB_GID_INDEX) and of perftest's C(-x). The index is where the kernel
    put the entry at boot and can move across reboots, so read it, never pin it.
  - Also with O(cluster_addr), every RDMA device whose netdev has an address on the cluster link's
    subnet (from the prefix length of O(cluster_addr), else from the connected route to it in
    C(/proc/net/route); all devices when neither tells), and the DGX Spark detail that one ConnectX-7
    port is two PCIe halves, two RDMA devices (C(rocep1s0f1) and C(roceP2p1s0f1), netdevs
    C(enp1s0f1np1) and C(enP2p1s0f1np1)); the other half of the port that carries the address is
    reported as its twin, and both are in the HCA list NCCL should use (C(NCCL_IB_HCA)).
  - Warns when the port that carries the address is not C(ACTIVE), when the twin is down, when a netdev of
    the link is not C(up), and when the link's netdevs have different MTUs.
  - A node without C(/sys/class/infiniband) gets an empty device list and the summary
    "no RDMA devices (TCP sockets)", not a failure; an address on no RDMA netdev is a message in the
    fact, not a failure. A sysfs file that is missing, empty, not text or unreadable becomes a note naming
    the file, never a traceback.
  - Only reads; never reports a change.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.read_only
attributes:
  facts:
    support: full
    description: Sets the fact C(uma_rdma).
options:
  sysfs_root:
    description:
      - Root of sysfs; the devices are read under C(<sysfs_root>/class/infiniband) and the netdevs under
        C(<sysfs_root>/class/net). Tests point it at a copy of a sysfs tree.
      - Refused when it is not a directory with a C(class/) directory in it.
    type: path
    default: /sys
  proc_root:
    description:
      - Root of procfs; C(<proc_root>/net/route) gives the cluster link's subnet when O(cluster_addr) has no
        prefix length.
    type: path
    default: /proc
  cluster_addr:
    description:
      - The node's IPv4 address on the cluster link (the CX-7 netdev's address on a DGX Spark pair),
        optionally with its prefix length, e.g. V(192.168.177.11) or V(192.168.177.11/24).
      - Refused, naming the value, when it is not an IPv4 address, is IPv6, has a prefix length outside
        1-32, or is the unspecified, a multicast or the broadcast address.
      - Left out (or empty), only the devices are reported and RV(ansible_facts.uma_rdma.cluster) is V(null).
    type: str
notes:
  - C(/proc/net/route) is per network namespace; run the module in the namespace the engine uses (the host's,
    for the collection's engines).
seealso:
  - module: uma.vllm.node_facts
"""

EXAMPLES = r"""
- name: Read the node's RDMA devices and where its cluster address is in their GID tables
  uma.vllm.rdma_facts:
    cluster_addr: "{{ uma_cluster_addr }}"  # the inventory's address on the ConnectX-7 link

- name: The same with the link's prefix length, so the devices on its subnet are listed without the route table
  uma.vllm.rdma_facts:
    cluster_addr: 192.168.177.11/24

- name: Say what was found
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }}: {{ ansible_facts.uma_rdma.summary }}"

- name: The GID index and the HCAs for NCCL, when the address is on an RDMA device
  ansible.builtin.debug:
    msg: "NCCL_IB_GID_INDEX={{ link.gid_index }} NCCL_IB_HCA={{ link.hcas | join(',') }}"
  vars:
    link: "{{ ansible_facts.uma_rdma.cluster }}"
  when: ansible_facts.uma_rdma.cluster.found

- name: Stop when the node has RDMA devices but the cluster address is on none of them
  ansible.builtin.assert:
    that: ansible_facts.uma_rdma.cluster.found
    fail_msg: "{{ ansible_facts.uma_rdma.cluster.message }}"
  when: ansible_facts.uma_rdma.present
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host.
  returned: always
  type: complex
  contains:
    uma_rdma:
      description: The node's RDMA devices and, with O(cluster_addr), where that address is.
      returned: always
      type: complex
      contains:
        present:
          description: Whether the node has any RDMA device.
          type: bool
          returned: always
          sample: true
        summary:
          description: One line; C(no RDMA devices) followed by C(TCP sockets) in parentheses on a node without any.
          type: str
          returned: always
          sample: >-
            4 RDMA devices (rocep1s0f0, rocep1s0f1, roceP2p1s0f0, roceP2p1s0f1), 2 of 4 ports ACTIVE;
            192.168.177.11 is RoCE v2 GID index 3 of rocep1s0f1 port 1 (netdev enp1s0f1np1)
        active_ports:
          description: How many ports are C(ACTIVE).
          type: int
          returned: always
          sample: 2
        devices:
          description:
            - Every device of C(class/infiniband), sorted by name. C(node_type), C(node_guid), C(sys_image_guid)
              and C(parent) (soft-RoCE's netdev) are V(null) when the file is not there; C(netdevs) lists
              C(device/net); C(pci) is the PCI domain, bus, slot and function (from the C(device) link or
              udev's C(roce[P<domain>]p<bus>s<slot>f<function>) name), V(null) for a device without one.
            - Per port, C(state), C(phys_state), C(rate) and C(link_layer) as sysfs writes them, with
              C(state_name), C(active) and C(rate_gbps) parsed from them; C(netdev) with
              C(netdev_source), C(mtu) and C(operstate); C(ipv4), the addresses of the IPv4-mapped GIDs;
              C(gids), the table entries that hold a GID (C(index), C(gid), C(type), C(netdev), C(ipv4)).
            - A value sysfs did not give as expected is V(null), with a note in RV(ansible_facts.uma_rdma.notes).
          type: list
          elements: dict
          returned: always
          sample:
            - name: rocep1s0f1
              node_type: "1: CA"
              node_guid: "0200:0003:0000:1a17"
              sys_image_guid: "0200:0003:0000:1a16"
              parent: null
              netdevs: [enp1s0f1np1]
              pci: {domain: 0, bus: 1, slot: 0, function: 1}
              ports:
                - port: 1
                  state: "4: ACTIVE"
                  state_name: ACTIVE
                  active: true
                  phys_state: "5: LinkUp"
                  rate: 200 Gb/sec (2X NDR)
                  rate_gbps: 200.0
                  link_layer: Ethernet
                  netdev: enp1s0f1np1
                  netdev_source: gid_attrs/ndevs/0
                  mtu: 9000
                  operstate: up
                  ipv4: [192.168.177.11]
                  gids:
                    - {index: 3, gid: "0000:0000:0000:0000:0000:ffff:c0a8:b10b", type: RoCE v2,
                       netdev: enp1s0f1np1, ipv4: 192.168.177.11}
        cluster:
          description:
            - V(null) without O(cluster_addr). Otherwise C(address) and its C(gid) in sysfs form; C(found),
              C(gid_index), C(device), C(port) and C(netdev) of its RoCE v2 GID (V(null) when not found);
              C(message), one line saying where it is or why it was not found and what to do.
            - C(prefix), C(subnet) and C(subnet_source) (V(cluster_addr) or the route it came from; V(null)
              when unknown); C(devices), the ports whose netdev has an address on that subnet (every port when
              the subnet is unknown, C(devices_basis) says which), each with C(device), C(port), C(netdev),
              C(state), C(active), C(mtu), C(operstate), C(ipv4).
            - C(twins), the ports of the other PCIe half of the port that carries the address (same PCI bus,
              slot and function in another PCI domain, same C(sys_image_guid)); C(hcas), that device, then the
              active devices on the subnet and the active twins (for C(NCCL_IB_HCA)); C(warnings).
          type: dict
          returned: always
          sample:
            address: 192.168.177.11
            gid: "0000:0000:0000:0000:0000:ffff:c0a8:b10b"
            found: true
            gid_index: 3
            device: rocep1s0f1
            port: 1
            netdev: enp1s0f1np1
            message: 192.168.177.11 is RoCE v2 GID index 3 of rocep1s0f1 port 1 (netdev enp1s0f1np1)
            prefix: 24
            subnet: 192.168.177.0/24
            subnet_source: cluster_addr
            devices_basis: subnet
            devices:
              - {device: rocep1s0f1, port: 1, netdev: enp1s0f1np1, state: "4: ACTIVE", active: true, mtu: 9000,
                 operstate: up, ipv4: [192.168.177.11]}
            twins:
              - {device: roceP2p1s0f1, port: 1, netdev: enP2p1s0f1np1, state: "4: ACTIVE", active: true, mtu: 9000,
                 operstate: up, ipv4: [192.168.178.11]}
            hcas: [rocep1s0f1, roceP2p1s0f1]
            warnings: []
        warnings:
          description: The cluster link's warnings (also shown as task warnings); V([]) without O(cluster_addr).
          type: list
          elements: str
          returned: always
          sample: ["the cluster link's RDMA netdevs have different MTUs (enP2p1s0f1np1 1500, enp1s0f1np1 9000): ..."]
        notes:
          description: One line per sysfs file that was missing, empty, not text, not a regular file or unreadable.
          type: list
          elements: str
          returned: always
          sample: ["/sys/class/infiniband/rocep1s0f1/ports/1/rate: is empty"]
        sysfs_root:
          description: The O(sysfs_root) that was read.
          type: str
          returned: always
          sample: /sys
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.system import rdma as _rdma


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            proc_root=dict(type="path", default="/proc"),
            cluster_addr=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    try:
        facts = _rdma.rdma_facts(_rdma.check_request(module.params))
    except UmaError as err:
        module.fail_json(msg=err.message)
    for warning in facts["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts={"uma_rdma": facts})


if __name__ == "__main__":
    main()
