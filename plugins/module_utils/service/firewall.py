# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster link's firewall on a node of the uma.vllm.vllm_service role (issue 19 item 7).

What listens between the nodes of a multi-node engine is reachable only from the engine's own
nodes: vLLM's ``master_port`` (torch.distributed's TCPStore listens on every address and vLLM
cannot bind it), the launchers' rank link (``link_port``), the watchdogs' status port, rank 0's
model copy port (``master_port + 12``, open only while a model is copied) and, with the Ray
backend, Ray's head port. One nftables table, ``inet uma_vllm``, with one ``input`` chain:
a TCP packet to one of an engine's ports from an address that is not one of the engine's nodes'
cluster addresses (``uma_cluster_addr``) is dropped; loopback is never filtered. The table is
replaced whole in one transaction (``nft -f``), so a run never leaves half a ruleset.

NCCL/gloo's sockets, torch's worker connections and Ray's worker ports have no fixed port: they
listen on the node's ephemeral range (``net.ipv4.ip_local_port_range``). With ``ephemeral`` (that
range, read from the node) one more rule drops NEW TCP connections to this range on this node's own
cluster address from any address that is not one of its multi-node engines' nodes (all of them
together: two engines that share a node must not drop each other's peers). Replies to the node's
own connections are not new; other addresses of the node are not touched.
Runs on the controller only (filter vllm_service_firewall_rules in plugins/filter/vllm_service.py).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Dict, List, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.service.base import COPY_PORT_OFFSET, STATUS_PORT_OFFSET
from ansible_collections.uma.vllm.plugins.module_utils.service.engines import EngineModelError

TABLE = "uma_vllm"
PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def _node_addr(hostvars: Any, host: str) -> Any:
    if host not in hostvars:
        return None
    hv = hostvars[host]
    node = hv.get("__vllm_service_node") if hasattr(hv, "get") else None
    if isinstance(node, dict) and node.get("addr"):
        return node["addr"]
    return hv.get("uma_cluster_addr") if hasattr(hv, "get") else None


def engine_ports(engine: Dict[str, Any]) -> List[int]:
    """The TCP ports of a multi-node engine that only its nodes may reach."""
    cluster = engine["cluster"]
    master = int(cluster["master_port"])
    ports = {
        master,
        int(cluster["link_port"]),
        int(engine.get("watchdog_port") or master + STATUS_PORT_OFFSET),
        master + COPY_PORT_OFFSET,  # a Hub model or a model_path copied between the nodes (model_copy)
    }
    if cluster.get("backend") == "ray":
        ports.add(int(cluster["ray_port"]))
    return sorted(ports)


def _cluster_ip(hostvars: Any, host: str, who: str, opt_out: str, why: str = "") -> Any:
    """The IP address of ``host`` on the cluster link, or EngineModelError naming ``who`` needs it (and
    ``why``) and ``opt_out``, the variable that turns that rule off."""
    raw = _node_addr(hostvars, host)
    try:
        return ipaddress.ip_address(str(raw).strip())
    except ValueError:
        raise EngineModelError(
            "%s: the cluster address of %s is %r, not an IP address%s Fix: set uma_cluster_addr of %s to its IP on "
            "the cluster link, or set %s: false." % (who, host, raw, why or ".", host, opt_out)
        ) from None


def _addresses(engine: Dict[str, Any], hostvars: Any) -> Tuple[List[str], List[str]]:
    v4: List[str] = []
    v6: List[str] = []
    who = "vllm_service_firewall (engine %s)" % engine["name"]
    why = ": the rules allow the engine's nodes by address."
    for node in engine["cluster"]["nodes"]:
        addr = _cluster_ip(hostvars, node, who, "vllm_service_firewall", why)
        (v6 if addr.version == 6 else v4).append(str(addr))
    return sorted(set(v4)), sorted(set(v6))


def _family_rules(ports: str, v4: List[str], v6: List[str]) -> List[str]:
    out = []
    if v4:
        out.append("meta nfproto ipv4 tcp dport %s ip saddr != { %s } drop" % (ports, ", ".join(v4)))
    else:
        out.append("meta nfproto ipv4 tcp dport %s drop" % ports)
    if v6:
        out.append("meta nfproto ipv6 tcp dport %s ip6 saddr != { %s } drop" % (ports, ", ".join(v6)))
    else:
        out.append("meta nfproto ipv6 tcp dport %s drop" % ports)
    return out


def _port_range(text: Any) -> Tuple[int, int]:
    """(low, high) from the text of the node's ``ip_local_port_range`` (refused when it is not two ports)."""
    parts = str(text).split()
    if len(parts) == 2 and all(p.isascii() and p.isdigit() for p in parts):
        low, high = int(parts[0]), int(parts[1])
        if 1 <= low <= high <= 65535:
            return low, high
    raise EngineModelError(
        "vllm_service_firewall_ephemeral: this node's %s reads %r, not two port numbers (low high): the rule for "
        "NCCL/gloo's and Ray's worker ports needs the range. Fix: set net.ipv4.ip_local_port_range to e.g. "
        "'32768 60999', or set vllm_service_firewall_ephemeral: false." % (PORT_RANGE_FILE, str(text)[:80])
    )


def _ephemeral_rules(
    host: str, hostvars: Any, text: Any, v4: List[str], v6: List[str], api_ports: List[int]
) -> List[str]:
    own = _cluster_ip(hostvars, host, "vllm_service_firewall_ephemeral", "vllm_service_firewall_ephemeral")
    low, high = _port_range(text)
    ports = "%d-%d" % (low, high)
    # an engine's API port inside the range stays the API's (clients may come from anywhere)
    apis = sorted({p for p in api_ports if low <= p <= high})
    if apis:
        ports += " tcp dport != { %s }" % ", ".join(str(p) for p in apis)
    family, match, allowed = ("ipv6", "ip6", v6) if own.version == 6 else ("ipv4", "ip", v4)
    strangers = " %s saddr != { %s }" % (match, ", ".join(allowed)) if allowed else ""
    return [
        "    # NCCL/gloo's and Ray's worker ports: new connections to this node's ephemeral ports (cluster address)",
        "    meta nfproto %s %s daddr %s tcp dport %s ct state new%s drop" % (family, match, own, ports, strangers),
    ]


def firewall_rules(
    engines: List[Dict[str, Any]],
    hostvars: Any,
    managed: str = "Managed by uma.vllm",
    host: Any = None,
    ephemeral: Any = None,
) -> str:
    """The nft script for this host's started multi-node engines ('' when it has none); with ``host``
    and ``ephemeral`` (the text of its ``ip_local_port_range``) also the rule for the ephemeral ports."""
    lines: List[str] = []
    every_v4: List[str] = []
    every_v6: List[str] = []
    for engine in engines or []:
        if not engine.get("cluster") or engine.get("state", "started") == "absent":
            continue
        v4, v6 = _addresses(engine, hostvars)
        every_v4.extend(v4)
        every_v6.extend(v6)
        ports = "{ %s }" % ", ".join(str(p) for p in engine_ports(engine))
        lines.append("    # engine %s: nodes %s" % (engine["name"], ", ".join(engine["cluster"]["nodes"])))
        lines.extend("    " + rule for rule in _family_rules(ports, v4, v6))
    if not lines:
        return ""
    if host is not None and ephemeral is not None:
        api_ports = []
        for engine in engines or []:
            try:
                api_ports.append(int(engine.get("port")))
            except (TypeError, ValueError):
                pass
        lines.extend(
            _ephemeral_rules(str(host), hostvars, ephemeral, sorted(set(every_v4)), sorted(set(every_v6)), api_ports)
        )
    head = [
        "#!/usr/sbin/nft -f",
        "# %s" % managed.replace("\n", " "),
        "# Only the engines' own nodes reach their cluster ports (docs/OPERATIONS.md, ports the cluster needs).",
        # create-then-delete: the table is replaced whole, in the same transaction as the new one
        "table inet %s" % TABLE,
        "delete table inet %s" % TABLE,
        "table inet %s {" % TABLE,
        "  chain input {",
        "    type filter hook input priority filter - 5; policy accept;",
        '    iif "lo" accept',
    ]
    return "\n".join([*head, *lines, "  }", "}", ""])
