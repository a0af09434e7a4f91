# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/link_check.yml (issue 35 item 4): which pairs of nodes to measure, and the report.

Every multi-node engine of the inventory gives the pairs (its rank-0 node, each other node); two
engines on the same nodes are measured once, named for both. Each pair is measured over the nodes'
cluster addresses by playbooks/files/link_probe.py (TCP round trips and throughput) and printed
against the rate of the interface that carries the address (the facts' ``speed``; unknown for a
virtual NIC that reports none). RDMA is read with uma.vllm.rdma_facts on each node: where both ends
have an RDMA device on the link and perftest's ``ib_write_bw`` / ``ib_write_lat``, the report says
so and names the commands; they are not run by this playbook (not measured: no RDMA device in the
lab to prove them on).

Pure functions on plain data, controller only (filters ``link_check_pairs``, ``link_check_report``
in plugins/filter/link_check.py). Tests: tests/unit/plugins/module_utils/test_link_check.py.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.service import link_preflight
from ansible_collections.uma.vllm.plugins.module_utils.service.base import EngineModelError, _err, node_ports
from ansible_collections.uma.vllm.plugins.module_utils.service.engines import host_engines

PORT_FIX = "Give link_check_port a TCP port from 1024 to 65000 that no engine of the nodes listens on."


def _hv(hostvars: Any, host: str) -> Any:
    return hostvars[host] if host in hostvars else None


def pairs(engines: Any, hostvars: Any, play_hosts: Any, port: Any = 29590) -> List[Dict[str, Any]]:
    """The pairs to measure: ``server`` (an engine's rank-0 node), ``client`` (another node of it), their
    cluster addresses, ``engines`` (names), ``port`` (the probe's port on the server: ``port`` + index)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65000:
        raise EngineModelError(_err("link_check_port", port, "is not a TCP port from 1024 to 65000", PORT_FIX))
    found: Dict[tuple, Dict[str, Any]] = {}
    for engine in engines or []:
        if not isinstance(engine, dict) or engine.get("state") == "absent":
            continue
        nodes = engine.get("nodes")
        if not isinstance(nodes, list) or len(nodes) < 2:
            continue
        head = str(nodes[0])
        for other in [str(n) for n in nodes[1:]]:
            key = (head, other)
            if key in found:
                found[key]["engines"].append(str(engine.get("name")))
                continue
            entry = {"server": head, "client": other, "engines": [str(engine.get("name"))], "problem": None}
            for role, host in (("server", head), ("client", other)):
                hv = _hv(hostvars, host)
                addr = hv.get("uma_cluster_addr") if hv is not None and hasattr(hv, "get") else None
                entry[role + "_addr"] = str(addr) if addr not in (None, "") else None
                if host not in (play_hosts or []):
                    entry["problem"] = "%s is not in this play (--limit, or unreachable)" % host
                elif entry[role + "_addr"] is None:
                    entry["problem"] = "%s has no uma_cluster_addr" % host
            found[key] = entry
    out = list(found.values())
    for index, entry in enumerate(out):
        entry["port"] = port + index
        # the ports the server node's engines listen on (service/base.py's one rule, node_ports)
        for engine in host_engines(engines or [], entry["server"]):
            owner = node_ports(engine).get(entry["port"])
            if owner:
                raise EngineModelError(_err("link_check_port", port, "gives port %d on %s, where engine %s's %s"
                                            " listens" % (entry["port"], entry["server"], engine.get("name"),
                                                          owner[1]), PORT_FIX))  # fmt: skip
    return out


def _rate(view: Optional[Dict[str, Any]]) -> str:
    if not view or not view.get("interface"):
        return "interface unknown"
    speed = view.get("speed_mbit")
    return "%s, %s" % (view["interface"], "%g Gbit/s" % (speed / 1000.0) if speed else "rate not reported")


def _rdma(host: str, facts: Any) -> Optional[str]:
    if not isinstance(facts, dict):
        return "%s: RDMA devices not read" % host
    if not facts.get("present"):
        return None
    cluster = facts.get("cluster") if isinstance(facts.get("cluster"), dict) else {}
    if not cluster.get("found"):
        return "%s: RDMA devices, none carries the cluster address" % host
    return "%s: %s port %s, RoCE v2 GID index %s" % (host, cluster.get("device"), cluster.get("port"),
                                                     cluster.get("gid_index"))  # fmt: skip


def _parsed(result: Any) -> Dict[str, Any]:
    """The probe client's JSON from its task result (``stdout``), or ``{"error": ...}``."""
    if not isinstance(result, dict):
        return {"error": "no result"}
    text = result.get("stdout")
    try:
        found = json.loads(text) if isinstance(text, str) and text.strip() else None
    except ValueError:
        found = None
    if isinstance(found, dict):
        return found
    tail = " ".join(str(result.get("stderr") or result.get("msg") or "").split()[-30:])
    return {"error": "the probe printed no result (rc %s): %s" % (result.get("rc"), tail or "no output")}


def report(pairs_: Any, results: Any, hostvars: Any) -> Dict[str, Any]:
    """``results``: the probe client task's loop results (each with its ``item``, a pair, and ``stdout``:
    the client's JSON, ``rtt_us_median``, ``rtt_us_p99``, ``gbit_s``, ``bytes``, ``seconds``, or
    ``error``). Returns ``pairs`` (each with its numbers and the interface's rate) and ``lines``."""
    lines: List[str] = []
    out = []
    by_pair = {}
    for result in results or []:
        item = result.get("item") if isinstance(result, dict) else None
        if isinstance(item, dict):
            by_pair[(item.get("server"), item.get("client"))] = _parsed(result)
    for pair in pairs_ or []:
        got = by_pair.get((pair["server"], pair["client"]), {})
        entry = dict(pair, result=got)
        names = ", ".join(pair["engines"])
        head = "%s: %s (%s) -> %s (%s)" % (names, pair["client"], pair.get("client_addr"), pair["server"],
                                           pair.get("server_addr"))  # fmt: skip
        if pair.get("problem"):
            lines.append("%s: not measured, %s" % (head, pair["problem"]))
            out.append(entry)
            continue
        hv = _hv(hostvars, pair["client"])
        facts = hv.get("ansible_facts") if hv is not None and hasattr(hv, "get") else None
        view = link_preflight.view(facts or {}, pair.get("client_addr"))
        entry["interface"], entry["speed_mbit"] = view.get("interface"), view.get("speed_mbit")
        if got.get("error") or not isinstance(got.get("gbit_s"), (int, float)):
            lines.append("%s: TCP probe failed: %s" % (head, got.get("error") or "no result"))
        else:
            share = ""
            if view.get("speed_mbit"):
                share = " (%.0f%% of %s)" % (100.0 * got["gbit_s"] * 1000 / view["speed_mbit"], _rate(view))
            else:
                share = " (%s)" % _rate(view)
            lines.append("%s: TCP %.2f Gbit/s%s, round trip median %.0f us, p99 %.0f us (%d pings, %.1f s)" % (
                head, got["gbit_s"], share, got.get("rtt_us_median") or 0, got.get("rtt_us_p99") or 0,
                got.get("pings") or 0, got.get("seconds") or 0))  # fmt: skip
        rdma = []
        for host in (pair["client"], pair["server"]):
            hvh = _hv(hostvars, host)
            said = _rdma(host, hvh.get("__link_rdma", {}).get("ansible_facts", {}).get("uma_rdma")
                         if hvh is not None and hasattr(hvh, "get") and isinstance(hvh.get("__link_rdma"), dict)
                         else None)  # fmt: skip
            if said:
                rdma.append(said)
        if not rdma:
            lines.append("    RDMA: no RDMA device on either node: the engine's NCCL uses TCP sockets")
        else:
            lines.append("    RDMA: %s; not measured here (run perftest's ib_write_bw -d <device> -x <GID index>"
                         " --report_gbits on one node and the same with the other's address on the other)"
                         % "; ".join(rdma))  # fmt: skip
        out.append(entry)
    if not out:
        lines.append("no multi-node engine in vllm_service_engines: nothing to measure")
    return {"pairs": out, "lines": lines}
