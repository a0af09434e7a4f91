# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's RDMA devices, read from sysfs, and the RoCE v2 GID index of its cluster address
(module ``uma.vllm.rdma_facts``).

No vendor tool (``ibv_devinfo``, ``show_gids``, ``ibdev2netdev``): only the files the kernel's
RDMA core writes (drivers/infiniband/core/sysfs.c), per device under
``<sysfs_root>/class/infiniband/<device>/``:

- ``node_type`` (``1: CA``), ``node_guid``, ``sys_image_guid`` (one value for every RDMA device of
  one adapter), ``parent`` (soft-RoCE only: the netdev it runs over), ``device/net/*`` (the netdevs
  of the PCI function), ``device`` itself (a link to the PCI function, ``0000:01:00.1``);
- per port ``ports/<n>/``: ``state`` (``4: ACTIVE``), ``phys_state`` (``5: LinkUp``), ``rate``
  (``200 Gb/sec (2X NDR)``), ``link_layer`` (``Ethernet`` for RoCE, ``InfiniBand``), and the GID
  table ``gids/<i>`` with ``gid_attrs/types/<i>`` (``IB/RoCE v1``, ``RoCE v2``) and
  ``gid_attrs/ndevs/<i>`` (the netdev the GID belongs to);
- of the port's netdev: ``<sysfs_root>/class/net/<netdev>/{mtu,operstate}``.

An unused GID table entry reads as the zero GID and its ``gid_attrs`` files fail with EINVAL
(sysfs.c ``show_port_gid`` / ``_show_port_gid_attr``): only entries with a GID are read further.
Every IPv4 address of a RoCE netdev is in the table as the IPv4-mapped GID ``::ffff:a.b.c.d``
(sysfs writes ``0000:0000:0000:0000:0000:ffff:c0a8:b10b``), once per GID type; the index of the
``RoCE v2`` one is what ``NCCL_IB_GID_INDEX`` and perftest's ``-x`` want, and it is not stable
across reboots (it is where the kernel packed the entry), so it is read, never assumed.

The cluster link's subnet comes from ``cluster_addr``'s prefix length (``a.b.c.d/24``) or, without
one, from the connected route to the address in ``<proc_root>/net/route``. A DGX Spark's CX-7 port
is two PCIe halves, two RDMA devices (``rocep1s0f1`` and ``roceP2p1s0f1``, the same PCI bus, slot
and function in two PCI domains, one ``sys_image_guid``): the half that carries the address has
its twin reported beside it.

A file that is missing, empty, not text, not a regular file or unreadable becomes one note naming
it, and its value ``None``; nothing here raises for what it finds on the node. Bad options raise
``UmaError``. Nothing here imports Ansible.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import sys
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, check_path

NO_RDMA = "no RDMA devices (TCP sockets)"
ROCE_V2 = "RoCE v2"
ZERO_GID = ":".join(["0000"] * 8)
V4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
MAX_READ = 4096  # one sysfs page
CLUSTER_ADDR_FIX = (
    "Give the node's IPv4 address on the cluster link, e.g. 192.168.177.11, or with its prefix length, "
    "192.168.177.11/24; leave it out for the devices alone."
)

_GID_RE = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")
_STATE_RE = re.compile(r"^([0-9]+): (\S.*)$")
_RATE_RE = re.compile(r"^([0-9]+(?:\.5)?) Gb/sec \(([0-9]+)X ?([A-Z0-9]*)\)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")
_PCI_RE = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
# udev's predictable names of RDMA devices on PCI: roce[P<domain>]p<bus>s<slot>[f<function>]
_ROCE_NAME_RE = re.compile(r"^roce(?:P([0-9]+))?p([0-9]+)s([0-9]+)(?:f([0-9]+))?")


# ---- options ---------------------------------------------------------------------------------


def check_cluster_addr(value: Any) -> Optional[Tuple[str, Optional[int]]]:
    """``cluster_addr``: None/empty, ``a.b.c.d`` or ``a.b.c.d/prefix`` -> (address, prefix or None)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise UmaError("cluster_addr", value, "is not a string", CLUSTER_ADDR_FIX)
    address_text, slash, prefix_text = value.strip().partition("/")
    if ":" in address_text:
        raise UmaError(
            "cluster_addr",
            value,
            "is an IPv6 address; the RoCE v2 GID looked for is the IPv4-mapped one (::ffff:a.b.c.d)",
            CLUSTER_ADDR_FIX,
        )
    try:
        address = ipaddress.IPv4Address(address_text)
    except ValueError as err:
        raise UmaError("cluster_addr", value, "is not an IPv4 address (%s)" % err, CLUSTER_ADDR_FIX) from None
    prefix: Optional[int] = None
    if slash:
        if not (prefix_text.isascii() and prefix_text.isdigit()) or not 1 <= int(prefix_text) <= 32:
            raise UmaError(
                "cluster_addr", value, "has a prefix length that is not a whole number 1-32", CLUSTER_ADDR_FIX
            )
        prefix = int(prefix_text)
    if address.is_unspecified or address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        raise UmaError("cluster_addr", value, "cannot be the address of a network interface", CLUSTER_ADDR_FIX)
    return str(address), prefix


def check_request(params: Dict[str, Any]) -> Dict[str, Any]:
    """The module's options, checked; ``sysfs_root`` must be a directory with ``class/`` in it."""
    fix = "Give the root of sysfs, /sys (the unit tests give a copy of one)."
    sysfs_root = check_path("sysfs_root", params.get("sysfs_root"), fix=fix)
    if not os.path.isdir(sysfs_root):
        raise UmaError("sysfs_root", sysfs_root, "is not a directory", fix)
    if not os.path.isdir(os.path.join(sysfs_root, "class")):
        raise UmaError(
            "sysfs_root",
            sysfs_root,
            "has no class/ directory: it is not the root of sysfs (or sysfs is not mounted there)",
            fix,
        )
    proc_root = check_path("proc_root", params.get("proc_root"), fix="Give the root of procfs, /proc.")
    cluster = check_cluster_addr(params.get("cluster_addr"))
    return {"sysfs_root": sysfs_root, "proc_root": proc_root, "cluster": cluster}


# ---- reading ---------------------------------------------------------------------------------


class Reader:
    """Reads sysfs attribute files; every problem becomes one note naming the file."""

    def __init__(self) -> None:
        self.notes: List[str] = []

    def note(self, path: str, problem: str) -> None:
        self.notes.append("%s: %s" % (path, problem))

    def read(self, path: str, required: bool = True) -> Optional[str]:
        """The file's text, stripped; None (and a note) when it is not a readable, non-empty text file.
        A missing file gets a note only when ``required``."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            if required:
                self.note(path, "missing")
            return None
        except OSError as err:
            self.note(path, "cannot be read (%s)" % (err.strerror or err))
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.note(path, "is not a regular file")
                return None
            data = os.read(fd, MAX_READ)
        except OSError as err:
            self.note(path, "cannot be read (%s)" % (err.strerror or err))
            return None
        finally:
            os.close(fd)
        if b"\x00" in data:
            self.note(path, "holds NUL bytes, not text")
            return None
        try:
            text = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            self.note(path, "is not UTF-8 text")
            return None
        if not text:
            self.note(path, "is empty")
            return None
        return text

    def entries(self, path: str, what: str, pattern: re.Pattern[str] = _NAME_RE) -> List[str]:
        """Sorted names in a directory ([] when it is missing); a name not matching ``pattern`` is
        left out with a note (sysfs names are plain; anything else is damage)."""
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return []
        except OSError as err:
            self.note(path, "cannot be listed (%s)" % (err.strerror or err))
            return []
        good = []
        for name in names:
            if pattern.match(name):
                good.append(name)
            else:
                self.note(path, "left out %s: %s" % (what, ascii(name)))
        return sorted(good, key=lambda n: (len(n), n) if n.isdigit() else (0, n.lower(), n))

    def integer(self, path: str) -> Optional[int]:
        text = self.read(path)
        if text is None:
            return None
        if not (text.isascii() and text.isdigit()) or len(text) > 9:
            self.note(path, "%s is not a whole number" % ascii(text))
            return None
        return int(text)


def parse_state(text: Optional[str]) -> Tuple[Optional[int], Optional[str]]:
    """``4: ACTIVE`` -> (4, 'ACTIVE'); anything else -> (None, None)."""
    match = _STATE_RE.match(text or "")
    return (int(match.group(1)), match.group(2)) if match and len(match.group(1)) <= 3 else (None, None)


def parse_rate(text: Optional[str]) -> Optional[float]:
    """``200 Gb/sec (2X NDR)`` -> 200.0; ``2.5 Gb/sec (1X SDR)`` -> 2.5; anything else -> None."""
    match = _RATE_RE.match(text or "")
    return float(match.group(1)) if match and len(match.group(1)) <= 6 else None


def gid_ipv4(gid: str) -> Optional[str]:
    """The IPv4 address of an IPv4-mapped GID (``0000:...:ffff:c0a8:b10b`` -> 192.168.177.11)."""
    if not gid.startswith(V4_MAPPED_PREFIX):
        return None
    raw = gid[len(V4_MAPPED_PREFIX) :].replace(":", "")
    return str(ipaddress.IPv4Address(int(raw, 16)))


def mapped_gid(address: str) -> str:
    """The sysfs form of the IPv4-mapped GID of ``address``."""
    raw = "%08x" % int(ipaddress.IPv4Address(address))
    return V4_MAPPED_PREFIX + raw[:4] + ":" + raw[4:]


def pci_location(name: str, device_link: Optional[str]) -> Optional[Dict[str, int]]:
    """The PCI domain, bus, slot and function of an RDMA device: from its ``device`` link
    (``.../0002:01:00.1``) or, without one, from udev's name (``roceP2p1s0f1``)."""
    match = _PCI_RE.match(os.path.basename(device_link or ""))
    if match:
        return {k: int(v, 16) for k, v in zip(("domain", "bus", "slot", "function"), match.groups())}
    match = _ROCE_NAME_RE.match(name)
    if match:
        domain, bus, slot, function = match.groups()
        return {"domain": int(domain or 0), "bus": int(bus), "slot": int(slot), "function": int(function or 0)}
    return None


def read_gids(port_dir: str, reader: Reader) -> List[Dict[str, Any]]:
    """The port's GID table entries that hold a GID, in index order."""
    gids = []
    gid_dir = os.path.join(port_dir, "gids")
    for index in reader.entries(gid_dir, "a GID entry", re.compile(r"^[0-9]{1,5}$")):
        path = os.path.join(gid_dir, index)
        gid = reader.read(path)
        if gid is None:
            continue
        gid = gid.lower()
        if not _GID_RE.match(gid):
            reader.note(path, "%s is not a GID (8 groups of 4 hex digits)" % ascii(gid[:80]))
            continue
        if gid == ZERO_GID:
            continue
        gids.append(
            {
                "index": int(index),
                "gid": gid,
                "type": reader.read(os.path.join(port_dir, "gid_attrs", "types", index), required=False),
                "netdev": reader.read(os.path.join(port_dir, "gid_attrs", "ndevs", index), required=False),
                "ipv4": gid_ipv4(gid),
            }
        )
    return gids


def read_netdev(sysfs_root: str, netdev: Optional[str], reader: Reader) -> Tuple[Optional[int], Optional[str]]:
    """(mtu, operstate) of a netdev from ``class/net/<netdev>/``."""
    if not netdev or not _NAME_RE.match(netdev) or netdev in (".", ".."):
        return None, None
    base = os.path.join(sysfs_root, "class", "net", netdev)
    return reader.integer(os.path.join(base, "mtu")), reader.read(os.path.join(base, "operstate"))


def read_port(sysfs_root: str, dev_dir: str, port: str, device: Dict[str, Any], reader: Reader) -> Dict[str, Any]:
    port_dir = os.path.join(dev_dir, "ports", port)
    state = reader.read(os.path.join(port_dir, "state"))
    _number, state_name = parse_state(state)
    if state is not None and state_name is None:
        reader.note(os.path.join(port_dir, "state"), "%s is not '<number>: <NAME>'" % ascii(state[:80]))
    rate = reader.read(os.path.join(port_dir, "rate"))
    rate_gbps = parse_rate(rate)
    if rate is not None and rate_gbps is None:
        reader.note(os.path.join(port_dir, "rate"), "%s is not '<n> Gb/sec (<w>X <speed>)'" % ascii(rate[:80]))
    gids = read_gids(port_dir, reader)
    netdev, source = None, None
    named = [g["netdev"] for g in gids if g["netdev"]]
    if named:
        netdev, source = named[0], "gid_attrs/ndevs/%d" % next(g["index"] for g in gids if g["netdev"])
    elif device["parent"]:
        netdev, source = device["parent"], "parent"
    elif len(device["netdevs"]) == 1:
        netdev, source = device["netdevs"][0], "device/net"
    mtu, operstate = read_netdev(sysfs_root, netdev, reader)
    ipv4 = []
    for gid in gids:
        if gid["ipv4"] and gid["ipv4"] not in ipv4:
            ipv4.append(gid["ipv4"])
    return {
        "port": int(port),
        "state": state,
        "state_name": state_name,
        "active": state_name == "ACTIVE",
        "phys_state": reader.read(os.path.join(port_dir, "phys_state")),
        "rate": rate,
        "rate_gbps": rate_gbps,
        "link_layer": reader.read(os.path.join(port_dir, "link_layer")),
        "netdev": netdev,
        "netdev_source": source,
        "mtu": mtu,
        "operstate": operstate,
        "ipv4": ipv4,
        "gids": gids,
    }


def read_device(sysfs_root: str, name: str, reader: Reader) -> Dict[str, Any]:
    dev_dir = os.path.join(sysfs_root, "class", "infiniband", name)
    link = os.path.join(dev_dir, "device")
    target = os.path.realpath(link) if os.path.islink(link) else None
    device: Dict[str, Any] = {
        "name": name,
        "node_type": reader.read(os.path.join(dev_dir, "node_type"), required=False),
        "node_guid": reader.read(os.path.join(dev_dir, "node_guid"), required=False),
        "sys_image_guid": reader.read(os.path.join(dev_dir, "sys_image_guid"), required=False),
        "parent": reader.read(os.path.join(dev_dir, "parent"), required=False),
        "netdevs": reader.entries(os.path.join(link, "net"), "a netdev"),
        "pci": pci_location(name, target),
    }
    ports_dir = os.path.join(dev_dir, "ports")
    ports = reader.entries(ports_dir, "a port", re.compile(r"^[0-9]{1,3}$"))
    if not ports:
        reader.note(ports_dir, "no ports (missing, empty or unreadable)")
    device["ports"] = [read_port(sysfs_root, dev_dir, port, device, reader) for port in ports]
    return device


def read_devices(sysfs_root: str, reader: Reader) -> List[Dict[str, Any]]:
    """Every device under ``class/infiniband``; [] when the directory is not there."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    if not os.path.isdir(base):
        if os.path.lexists(base):
            reader.note(base, "is not a directory")
        return []
    return [read_device(sysfs_root, name, reader) for name in reader.entries(base, "a device")]


def route_prefix(proc_root: str, address: str, netdev: Optional[str], reader: Reader) -> Optional[Tuple[int, str]]:
    """(prefix length, interface) of the connected route to ``address`` in ``<proc_root>/net/route``:
    the longest one, the one through ``netdev`` first. The kernel prints each address and mask as the
    32-bit number in the node's byte order (``%08X``)."""
    path = os.path.join(proc_root, "net", "route")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read(1 << 20).splitlines()[1:]
    except OSError as err:
        reader.note(path, "cannot be read (%s): the cluster link's subnet is unknown" % (err.strerror or err))
        return None
    best: Optional[Tuple[int, int, str]] = None
    target = ipaddress.IPv4Address(address)
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest, gateway, mask = (int(fields[i], 16).to_bytes(4, sys.byteorder) for i in (1, 2, 7))
        except (ValueError, OverflowError):
            continue
        try:
            network = ipaddress.IPv4Network((ipaddress.IPv4Address(dest), str(ipaddress.IPv4Address(mask))))
        except ValueError:
            continue
        if int.from_bytes(gateway, "big") or not network.prefixlen or target not in network:
            continue
        rank = (network.prefixlen, 1 if fields[0] == netdev else 0, fields[0])
        if best is None or rank[:2] > best[:2]:
            best = rank
    return (best[0], best[2]) if best else None


# ---- the cluster address ---------------------------------------------------------------------


def _ports(devices: List[Dict[str, Any]]):
    for device in devices:
        for port in device["ports"]:
            yield device, port


def _entry(device: Dict[str, Any], port: Dict[str, Any], addresses: List[str]) -> Dict[str, Any]:
    return {
        "device": device["name"],
        "port": port["port"],
        "netdev": port["netdev"],
        "state": port["state"],
        "active": port["active"],
        "mtu": port["mtu"],
        "operstate": port["operstate"],
        "ipv4": addresses,
    }


def twins_of(device: Dict[str, Any], devices: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The other PCIe halves of ``device``'s port: same bus, slot and function in another PCI domain,
    and the same ``sys_image_guid`` where both are known (a DGX Spark's rocep1s0f1 / roceP2p1s0f1)."""
    here = device["pci"]
    if not here:
        return []
    twins = []
    for other in devices:
        there = other["pci"]
        if other is device or not there or there["domain"] == here["domain"]:
            continue
        if any(there[k] != here[k] for k in ("bus", "slot", "function")):
            continue
        if device["sys_image_guid"] and other["sys_image_guid"] and device["sys_image_guid"] != other["sys_image_guid"]:
            continue
        twins.append(other)
    return twins


def _not_found(address: str, devices: List[Dict[str, Any]]) -> str:
    seen = [
        "%s %s" % (port["netdev"] or device["name"], ", ".join(port["ipv4"]))
        for device, port in _ports(devices)
        if port["ipv4"]
    ]
    return (
        "no RDMA device carries %s: no GID is ::ffff:%s (%s in sysfs). The IPv4 addresses on the RDMA "
        "netdevs are: %s. Put the address on the RDMA netdev of the cluster link (e.g. enp1s0f1np1 on a DGX "
        "Spark) or give cluster_addr the address that is there"
        % (address, address, mapped_gid(address), "; ".join(seen) or "none")
    )


def _locate(address: str, devices: List[Dict[str, Any]], result: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Fill the GID index of ``address`` into ``result``; return its device (None when not found)."""
    matches = [(d, p, g) for d, p in _ports(devices) for g in p["gids"] if g["ipv4"] == address]
    # an ACTIVE port first; otherwise the order of the devices (sorted by name)
    v2 = sorted((m for m in matches if m[2]["type"] == ROCE_V2), key=lambda m: not m[1]["active"])
    if not v2:
        if matches:
            device, port, gid = matches[0]
            result["message"] = (
                "%s is in the GID table of %s port %d (index %d) only as type %s, not %s: RDMA over this address "
                "needs RoCE v2 (check the driver and the kernel's RoCE GID types)"
                % (
                    address,
                    device["name"],
                    port["port"],
                    gid["index"],
                    gid["type"] or "unknown (no gid_attrs/types)",
                    ROCE_V2,
                )
            )
        else:
            result["message"] = _not_found(address, devices)
        return None
    device, port, gid = v2[0]
    result.update(
        found=True,
        gid_index=gid["index"],
        gid=gid["gid"],
        device=device["name"],
        port=port["port"],
        netdev=gid["netdev"] or port["netdev"],
    )
    result["message"] = "%s is RoCE v2 GID index %d of %s port %d (netdev %s)" % (
        address, gid["index"], device["name"], port["port"], result["netdev"] or "unknown",
    )  # fmt: skip
    if len(v2) > 1:
        others = ", ".join("%s port %d index %d" % (d["name"], p["port"], g["index"]) for d, p, g in v2[1:])
        result["warnings"].append(
            "%s is also a RoCE v2 GID of %s: one address belongs on one netdev" % (address, others)
        )
    if not port["active"]:
        result["warnings"].append(
            "%s port %d carries %s but its state is %s, not ACTIVE: RDMA over it fails until the link is up"
            % (device["name"], port["port"], address, port["state"] or "unknown")
        )
    return device


def _check_link(result: Dict[str, Any], entries: List[Dict[str, Any]]) -> None:
    """Warnings over the cluster link's RDMA netdevs: not 'up', different MTUs."""
    mtus = {}
    for entry in entries:
        if entry["netdev"] and entry["mtu"] is not None:
            mtus[entry["netdev"]] = entry["mtu"]
        if entry["netdev"] and entry["operstate"] not in (None, "up"):
            result["warnings"].append(
                "netdev %s of %s is %s, not up" % (entry["netdev"], entry["device"], entry["operstate"])
            )
    if len(set(mtus.values())) > 1:
        result["warnings"].append(
            "the cluster link's RDMA netdevs have different MTUs (%s): set one MTU on all of them (9000 on a DGX "
            "Spark pair), on both nodes" % ", ".join("%s %d" % kv for kv in sorted(mtus.items()))
        )


def cluster_view(
    devices: List[Dict[str, Any]], address: str, prefix: Optional[int], proc_root: str, reader: Reader
) -> Dict[str, Any]:
    """Where ``address`` is: its RoCE v2 GID index, device, port and netdev; the devices on its subnet;
    the other PCIe half of its port; warnings about the link."""
    result: Dict[str, Any] = {
        "address": address,
        "gid": mapped_gid(address),
        "found": False,
        "gid_index": None,
        "device": None,
        "port": None,
        "netdev": None,
        "warnings": [],
    }
    home = _locate(address, devices, result)
    source = "cluster_addr" if prefix else None
    if prefix is None:
        found = route_prefix(proc_root, address, result["netdev"], reader)
        if found:
            prefix, source = (
                found[0],
                "the route through %s in %s" % (found[1], os.path.join(proc_root, "net", "route")),
            )
    network = ipaddress.IPv4Network((address, prefix), strict=False) if prefix else None
    result.update(prefix=prefix, subnet=str(network) if network else None, subnet_source=source)
    listed = []
    for device, port in _ports(devices):
        on = [a for a in port["ipv4"] if network and ipaddress.IPv4Address(a) in network]
        if on or network is None:
            listed.append(_entry(device, port, on if network else port["ipv4"]))
    result["devices"] = listed
    result["devices_basis"] = "subnet" if network else "all (the subnet is unknown)"
    twins = []
    for twin in twins_of(home, devices) if home else []:
        for port in twin["ports"]:
            entry = _entry(twin, port, port["ipv4"])
            twins.append(entry)
            if not port["active"]:
                result["warnings"].append(
                    "%s, the other PCIe half of %s's port, is %s: RDMA gets half the port's bandwidth"
                    % (twin["name"], home["name"], port["state"] or "unknown")
                )
    result["twins"] = twins
    hcas = [result["device"]] if home else []
    for entry in (listed if network else []) + twins:
        if entry["active"] and entry["device"] not in hcas:
            hcas.append(entry["device"])
    result["hcas"] = hcas
    # the link: the port with the address, the others on its subnet (when known), the twins; each once
    link: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for entry in [e for e in listed if e["device"] == result["device"] or network] + twins:
        link.setdefault((entry["device"], entry["port"]), entry)
    _check_link(result, list(link.values()))
    return result


# ---- the facts -------------------------------------------------------------------------------


def _summary(devices: List[Dict[str, Any]], cluster: Optional[Dict[str, Any]], notes: List[str]) -> str:
    if not devices:
        text = NO_RDMA
    else:
        ports = [p for _d, p in _ports(devices)]
        text = "%d RDMA device%s (%s), %d of %d port%s ACTIVE" % (
            len(devices), "" if len(devices) == 1 else "s", ", ".join(d["name"] for d in devices),
            sum(1 for p in ports if p["active"]), len(ports), "" if len(ports) == 1 else "s",
        )  # fmt: skip
    if cluster:
        text += "; " + cluster["message"]
    if notes:
        text += "; %d sysfs file%s could not be read as expected (see notes)" % (
            len(notes),
            "" if len(notes) == 1 else "s",
        )
    return text


def rdma_facts(request: Dict[str, Any]) -> Dict[str, Any]:
    """The fact ``uma_rdma`` for a checked request (:func:`check_request`)."""
    reader = Reader()
    devices = read_devices(request["sysfs_root"], reader)
    cluster = None
    if request["cluster"]:
        address, prefix = request["cluster"]
        cluster = cluster_view(devices, address, prefix, request["proc_root"], reader)
    return {
        "present": bool(devices),
        "summary": _summary(devices, cluster, reader.notes),
        "devices": devices,
        "active_ports": sum(1 for _d, p in _ports(devices) if p["active"]),
        "cluster": cluster,
        "warnings": list(cluster["warnings"]) if cluster else [],
        "notes": reader.notes,
        "sysfs_root": request["sysfs_root"],
    }
