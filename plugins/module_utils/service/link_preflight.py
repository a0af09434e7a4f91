# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster link checked before any rank of a multi-node engine starts (issue 35 item 3).

Each node of the engine, from the facts this play gathered on it (``setup``'s network subset: every
interface's addresses, ``active``, ``mtu``) and the link ``service/rdma_link.py`` chose there:

- the node's cluster address (``uma_cluster_addr``) is on one of its interfaces, and that interface
  is up;
- the socket interface the engine is given (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``: the
  role's ``vllm_service_nccl_socket_ifname``, ``uma_net_interface``) is the one that carries the
  address (NCCL reads a name as a prefix, a list with ``,``; ``^`` excludes, ``=`` is exact);
- both ends of the link have one MTU (a link up at 1500 on one end and 9000 on the other passes small
  packets and stalls on large ones);
- every node uses the same transport (RDMA on one end and TCP sockets on the other cannot form one
  NCCL communicator).

The RoCE v2 GID of the address is rdma_link's: without one the node's link is TCP sockets (or refused
with ``vllm_service_rdma: true``). A failure is refused naming the engine, the node, the interface and
the fix; a node of the engine that is not in this play (``--limit``) or whose network facts were not
gathered is not checked, and the plan says so. Whether the peers answer over the link is the rank
link's rendezvous at start (it names the address and the error).

Pure functions on plain data, controller only; the role reaches them through
plugins/filter/vllm_service.py (``vllm_service_link_view``, ``vllm_service_link_preflight``).
Tests: tests/unit/plugins/module_utils/test_vllm_service_link_preflight.py.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.service.base import _err

MTU_FIX = (
    "Set one MTU on every end of the cluster link (9000 on a DGX Spark pair): ip link set dev <interface> mtu 9000"
    " on the node that differs, and the same in its netplan / NetworkManager profile so that it stays after a"
    " reboot."
)


def _addresses(entry: Dict[str, Any]) -> List[str]:
    out = []
    ipv4 = entry.get("ipv4")
    for item in ([ipv4] if isinstance(ipv4, dict) else []) + list(entry.get("ipv4_secondaries") or []):
        if isinstance(item, dict) and item.get("address"):
            out.append(str(item["address"]))
    for item in entry.get("ipv6") or []:
        if isinstance(item, dict) and item.get("address"):
            out.append(str(item["address"]))
    return out


def _same(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.split("%", 1)[0]) == ipaddress.ip_address(b.split("%", 1)[0])
    except ValueError:
        return a == b


def view(facts: Any, addr: Any, ifname: Any = None) -> Dict[str, Any]:
    """This node's end of the link from its gathered ``ansible_facts``: the interface that carries
    ``addr``, whether it is up, its MTU; ``checked`` False (and ``why``) when the facts have no
    interfaces (not gathered) or there is no address."""
    out: Dict[str, Any] = {"addr": None if addr in (None, "") else str(addr), "ifname": ifname or None,
                           "checked": False, "interface": None, "up": None, "mtu": None, "speed_mbit": None,
                           "why": None, "interfaces": []}  # fmt: skip
    if out["addr"] is None:
        out["why"] = "no uma_cluster_addr"
        return out
    names = facts.get("interfaces") if isinstance(facts, dict) else None
    if not isinstance(names, list):
        out["why"] = "its network facts were not gathered"
        return out
    out["checked"] = True
    for name in sorted(str(n) for n in names):
        entry = facts.get(name.replace("-", "_").replace(".", "_").replace(":", "_"))
        if not isinstance(entry, dict):
            continue
        device = str(entry.get("device") or name)
        addrs = _addresses(entry)
        if device != "lo" and len(out["interfaces"]) < 8:  # named in a refusal: the first few
            out["interfaces"].append("%s %s" % (device, ",".join(addrs) or "(no address)"))
        if out["interface"] is None and any(_same(out["addr"], a) for a in addrs):
            mtu = entry.get("mtu")
            speed = entry.get("speed")
            out.update(interface=device, up=bool(entry.get("active")),
                       mtu=mtu if isinstance(mtu, int) and not isinstance(mtu, bool) else None,
                       speed_mbit=speed if isinstance(speed, int) and not isinstance(speed, bool) and speed > 0
                       else None)  # fmt: skip
    return out


def _matches(ifname: str, interface: str) -> Optional[bool]:
    """Whether NCCL's interface spec ``ifname`` selects ``interface``; None where it cannot be told
    (an exclusion list)."""
    spec = ifname.strip()
    if spec.startswith("^"):
        return None
    exact = spec.startswith("=")
    names = [n.strip() for n in spec.lstrip("=").split(",") if n.strip()]
    return any(interface == n if exact else interface.startswith(n) for n in names)


def _node_errors(engine: str, host: str, seen: Dict[str, Any]) -> List[str]:
    errors = []
    addr, interface = seen.get("addr"), seen.get("interface")
    if interface is None:
        errors.append(_err(
            "uma_cluster_addr", addr,
            "of host %s (engine %s) is on none of its interfaces (%s)" % (
                host, engine, "; ".join(seen.get("interfaces") or []) or "it has none but lo"),
            "Set uma_cluster_addr in host_vars/%s.yml to the node's address on the cluster link (ip -br addr show),"
            " or put that address on the link's interface." % host,
        ))  # fmt: skip
        return errors
    if not seen.get("up"):
        errors.append(_err(
            "uma_cluster_addr", addr,
            "of host %s (engine %s) is on interface %s, which is down" % (host, engine, interface),
            "Bring %s up on %s (ip link set dev %s up; a ConnectX port needs its cable: ibdev2netdev shows it Up),"
            " then run the play again." % (interface, host, interface),
        ))  # fmt: skip
    ifname = seen.get("ifname")
    if isinstance(ifname, str) and ifname.strip() and _matches(ifname, interface) is False:
        errors.append(_err(
            "vllm_service_nccl_socket_ifname", ifname,
            "on host %s (engine %s) does not select %s, the interface of its cluster address %s: NCCL and gloo"
            " would bootstrap over another network" % (host, engine, interface, addr),
            "Set uma_net_interface in host_vars/%s.yml to %s (or leave it unset and give uma_cluster_addr the"
            " address of the interface you meant)." % (host, interface),
        ))  # fmt: skip
    return errors


def preflight(engines: Any, hostvars: Any) -> Dict[str, Any]:
    """The link checks of every multi-node engine in ``engines`` (this host's, not absent) over all its
    nodes, from what each node set in this play: ``__vllm_service_link_view`` (``view``) and
    ``__vllm_service_links`` (rdma_link.links). Returns ``errors`` (refusals) and ``lines`` (the plan's
    words per engine: what was checked, what could not be)."""
    errors: List[str] = []
    lines: Dict[str, List[str]] = {}
    for engine in engines or []:
        cluster = engine.get("cluster") if isinstance(engine, dict) else None
        if not cluster or engine.get("state") == "absent":
            continue
        name = str(engine.get("name"))
        said = lines.setdefault(name, [])
        views: Dict[str, Dict[str, Any]] = {}
        transports: Dict[str, str] = {}
        for host in [str(h) for h in cluster.get("nodes") or []]:
            hv = hostvars[host] if host in hostvars else None
            seen = hv.get("__vllm_service_link_view") if hv is not None and hasattr(hv, "get") else None
            if not isinstance(seen, dict):
                said.append("link preflight: host %s not checked (not in this play, or it failed before)" % host)
                continue
            if not seen.get("checked"):
                said.append("link preflight: host %s not checked (%s)" % (host, seen.get("why")))
                continue
            views[host] = seen
            errors.extend(_node_errors(name, host, seen))
            found = hv.get("__vllm_service_links")
            link = found.get(name) if isinstance(found, dict) else None
            if isinstance(link, dict) and link.get("transport") in ("rdma", "tcp"):
                transports[host] = link["transport"]
        mtus = {h: v["mtu"] for h, v in views.items() if v.get("interface") and isinstance(v.get("mtu"), int)}
        if len(set(mtus.values())) > 1:
            ends = ", ".join("%s %s mtu %d" % (h, views[h]["interface"], m) for h, m in sorted(mtus.items()))
            errors.append(_err("the cluster link of engine %s" % name, ends, "has different MTUs on its ends", MTU_FIX))
        if len(set(transports.values())) > 1:
            errors.append(_err(
                "the cluster link of engine %s" % name,
                ", ".join("%s %s" % (h, "RDMA" if t == "rdma" else "TCP sockets")
                          for h, t in sorted(transports.items())),
                "is RDMA on one end and TCP sockets on the other: its ranks cannot form one NCCL communicator",
                "Give every node of the engine a usable RDMA device on the link (uma.vllm.rdma_facts on each shows"
                " why not), or set rdma: false on the engine (vllm_service_rdma: false) for TCP sockets on all.",
            ))  # fmt: skip
        if views:
            said.append("link preflight: %s" % "; ".join(
                "%s %s %s mtu %s" % (h, v.get("interface") or "(no interface)", "up" if v.get("up") else "DOWN",
                                     v.get("mtu")) for h, v in sorted(views.items())))  # fmt: skip
    return {"errors": errors, "lines": lines}
