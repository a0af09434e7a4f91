# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the vllm_service role finds on a node and across its ranks: the rank-0 addresses, which
engines must restart, their unit states and the status it reports (the fingerprint of each
engine's files: service/files.py). Pure functions on registered task results (filters in
plugins/filter/vllm_service.py; tests/unit/plugins/module_utils/test_vllm_service_model.py).
"""

from __future__ import annotations

from typing import Any, Dict, List

from ansible_collections.uma.vllm.plugins.module_utils.service.engines import EngineModelError, role_text


def head_addrs(engines: List[Dict[str, Any]], hostvars: Any) -> Dict[str, Any]:
    """Cluster-link address of each multi-node engine's rank-0 host: what that host found in this
    play (``__vllm_service_node``), else its inventory's ``uma_cluster_addr``."""
    out: Dict[str, Any] = {}
    for engine in engines:
        cluster = engine.get("cluster")
        if not cluster or cluster["head"] in out:
            continue
        head = cluster["head"]
        addr = None
        if head in hostvars:
            hv = hostvars[head]
            node = hv.get("__vllm_service_node") if hasattr(hv, "get") else None
            if isinstance(node, dict) and node.get("addr"):
                addr = node["addr"]
            elif hv.get("uma_cluster_addr"):
                addr = hv.get("uma_cluster_addr")
        out[head] = str(addr) if addr else None
    return out


PRUNE = ("list", "remove", "none")


def prune_plan(installed: Any, keep: Any, absent: Any, prune: Any) -> Dict[str, List[str]]:
    """Which engines found on the node go (``remove``) and which, no longer in the inventory, stay
    (``orphans``: shown, left running) for vllm_service_prune = list (default), remove or none.
    An engine set to ``state: absent`` always goes; one that is merely missing from the inventory
    (renamed, a typo, another inventory's) goes only with ``remove`` (issue 21)."""
    if prune not in PRUNE:
        raise EngineModelError(
            "vllm_service_prune = %r is not list, remove or none. Fix: list (show the engines on the node that are"
            " no longer defined), remove (stop and remove them) or none." % (prune,)
        )
    keep_names = set(keep or [])
    orphans = sorted(str(n) for n in installed or [] if n not in keep_names and n not in (absent or []))
    remove = list(dict.fromkeys([*(absent or []), *(orphans if prune == "remove" else [])]))
    return {"remove": remove, "orphans": [] if prune == "remove" else orphans}


def peers_changed(engines: List[Dict[str, Any]], hostvars: Any) -> Dict[str, List[str]]:
    """What every other rank's host found changed in this play (``__vllm_service_local_changed``)."""
    out: Dict[str, List[str]] = {}
    for engine in engines:
        for node in (engine.get("cluster") or {}).get("nodes", []):
            if node in out or node not in hostvars:
                continue
            hv = hostvars[node]
            value = hv.get("__vllm_service_local_changed") if hasattr(hv, "get") else None
            out[node] = list(value) if isinstance(value, list) else []
    return out


def status_entry(
    config: Dict[str, Any], engines: List[Dict[str, Any]], restarted: List[str], health: List[Dict[str, Any]]
) -> Dict[str, Any]:
    """What vllm_service_status says about one engine."""
    engine = next(e for e in engines if e["name"] == config["name"])
    result = next((r for r in health if "rc" in r and (r.get("item") or {}).get("name") == config["name"]), None)
    return {
        "unit": "uma-vllm@%s.service" % config["name"],
        "state": engine["state"],
        "role": role_text(engine),
        "health_url": config.get("health_url"),
        "healthy": None if result is None else result["rc"] == 0,
        "restarted": config["name"] in (restarted or []),
        "port": config["port"],
    }


def changed(
    engines: List[Dict[str, Any]],
    written: List[str],
    unit_changed: bool,
    fingerprints: Dict[str, str],
    stamps: Dict[str, str],
) -> List[str]:
    """Started engines whose unit, drop-in, env file or config was written in this run, or whose
    files differ from what the running engine was started with (a run that failed before its
    restart, or the first start)."""
    out = []
    for engine in engines:
        if engine.get("state") != "started":
            continue
        name = engine["name"]
        if unit_changed or name in written or stamps.get(name) != fingerprints.get(name):
            out.append(name)
    return out


def with_peers(engines: List[Dict[str, Any]], local: List[str], peers_changed: Dict[str, Any]) -> List[str]:
    """A multi-node engine restarts on every node when any of its ranks changed."""
    out = list(local)
    for engine in engines:
        cluster = engine.get("cluster")
        if engine.get("state") != "started" or not cluster or engine["name"] in out:
            continue
        for node in cluster["nodes"]:
            if engine["name"] in (peers_changed.get(node) or []):
                out.append(engine["name"])
                break
    return out


def unit_states(stdout: str, names: List[str], prefix: str = "uma-vllm@") -> Dict[str, Dict[str, str]]:
    """``systemctl show -p Id -p ActiveState -p UnitFileState uma-vllm@a.service ...`` -> per engine
    (the units whose name starts with ``prefix``: the engines', or ``uma-vllm-watchdog@`` for theirs)."""
    out: Dict[str, Dict[str, str]] = {}
    for block in (stdout or "").split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        unit = props.get("Id", "")
        if unit.startswith(prefix) and unit.endswith(".service"):
            out[unit[len(prefix) : -len(".service")]] = props
    for name in names:
        out.setdefault(name, {"ActiveState": "inactive", "UnitFileState": ""})
    return out


ACTIVE = ("active", "activating", "reloading")


def unit_actions(
    engines: List[Dict[str, Any]], units: Dict[str, Dict[str, str]], restart: List[str]
) -> Dict[str, List[Any]]:
    """What the play does to each engine's unit, from the states read before it wrote anything
    (``unit_states``) and the engines it restarts anyway (``restart``, the handler's):

    - ``enable``: started engines whose unit is not enabled;
    - ``disable``: stopped engines whose unit is enabled or running (stopped and disabled);
    - ``start_api`` / ``start_workers``: started engines that are not running and not about to be
      restarted -- rank 0 and single-node engines first, then the other ranks;
    - ``reset``: both start lists (a start by the play must not use up the start limit).
    """
    out: Dict[str, List[Any]] = {"enable": [], "disable": [], "start_api": [], "start_workers": [], "reset": []}
    for engine in engines:
        name = engine["name"]
        unit = units.get(name) or {"ActiveState": "inactive", "UnitFileState": ""}
        running = unit.get("ActiveState") in ACTIVE
        enabled = unit.get("UnitFileState") == "enabled"
        if engine.get("state") == "stopped":
            if enabled or running:
                out["disable"].append(name)
            continue
        if engine.get("state") != "started":
            continue
        if not enabled:
            out["enable"].append(name)
        if not running and name not in (restart or []):
            out["start_api" if engine.get("api_rank") else "start_workers"].append(name)
    out["reset"] = out["start_api"] + out["start_workers"]
    return out
