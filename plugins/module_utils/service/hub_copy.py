# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A multi-node engine's model from the Hub, downloaded once (issue 21 item 3).

With ``vllm_service_model_source: rank0`` (the default) only rank 0's node downloads a multi-node
engine's model from the Hub (``uma.vllm.model_fetch``, verified there); the other ranks' nodes copy
that snapshot from rank 0 over the cluster link (``uma.vllm.model_copy``: rank 0 serves it read-only
on its cluster address, ``master_port + COPY_PORT_OFFSET``, for a bounded time; every request signed
with the engine's link key). What each file must be (name, size, sha256) and the commit come from
rank 0's model_fetch result through Ansible, never from the network. ``hub``: every node downloads
from the Hub itself, as before.

Pure functions on plain data, run on the controller (filters in plugins/filter/vllm_service.py;
tests/unit/plugins/module_utils/test_vllm_service_hub_copy.py).
"""

from __future__ import annotations

from typing import Any, Dict, List

from ansible_collections.uma.vllm.plugins.module_utils.service.base import (
    COPY_PORT_OFFSET,  # after the rank link (+10) and the watchdogs' status (+11)
)
from ansible_collections.uma.vllm.plugins.module_utils.service.files import link_key_file

SOURCES = ("rank0", "hub")


def source_errors(value: Any) -> List[str]:
    if value in SOURCES:
        return []
    return [
        "vllm_service_model_source = %r is not one of %s. Fix: rank0 (rank 0's node downloads a multi-node engine's"
        " model once, the other ranks copy it over the cluster link) or hub (every node downloads it itself)."
        % (value, ", ".join(SOURCES))
    ]


def copies_from_rank0(engine: Dict[str, Any], source: Any) -> bool:
    """Does this host's copy of the engine's model come from rank 0 (not from the Hub)?"""
    cluster = engine.get("cluster")
    return bool(engine.get("hub") and engine["hub"].get("dest") and cluster and cluster.get("rank", 0) > 0
                and source == "rank0" and engine.get("state") != "absent")  # fmt: skip


def serves_copies(engine: Dict[str, Any], source: Any) -> bool:
    cluster = engine.get("cluster")
    return bool(engine.get("hub") and engine["hub"].get("dest") and cluster and cluster.get("rank") == 0
                and source == "rank0" and engine.get("state") != "absent")  # fmt: skip


def _get(mapping: Any, key: str) -> Any:
    return mapping.get(key) if hasattr(mapping, "get") else None


def node_addr(hostvars: Any, host: str) -> Any:
    """A node's address on the cluster link (the role's node facts, else uma_cluster_addr), None when unset."""
    hv = hostvars[host] if host in hostvars else {}
    node = _get(hv, "__vllm_service_node")
    if isinstance(node, dict) and node.get("addr"):
        return str(node["addr"])
    addr = _get(hv, "uma_cluster_addr")
    return str(addr) if addr else None


def copy_port(engine: Dict[str, Any]) -> int:
    return int(engine["cluster"]["master_port"]) + COPY_PORT_OFFSET


def copy_url(addr: str, port: int) -> str:
    return "http://%s:%d" % ("[%s]" % addr if ":" in addr else addr, port)


def host_var(hostvars: Any, host: str, var: str) -> Any:
    """A host's variable from the play's hostvars, None when the host or the variable is not there."""
    return _get(hostvars[host] if host in hostvars else {}, var)


def loop_result(results: Any, name: str) -> Dict[str, Any]:
    """The result for the engine ``name`` in a registered loop over engines (``item`` = the engine)
    that was not skipped, {} when there is none."""
    for result in results or []:
        if isinstance(result, dict) and (result.get("item") or {}).get("name") == name and not result.get("skipped"):
            return result
    return {}


def copy_files(files: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The files a copy checks, as model_copy takes them: name, size, sha256 of each."""
    return [{"name": f["name"], "size": f["size"], "sha256": f["sha256"]} for f in files]


def _rank0_result(hostvars: Any, head: str, name: str) -> Dict[str, Any]:
    return loop_result(_get(host_var(hostvars, head, "__vllm_service_fetched"), "results"), name)


def receives(engines: List[Dict[str, Any]], hostvars: Any, source: Any, engines_dir: str) -> Dict[str, Any]:
    """What this host copies from rank 0: ``items`` (the model_copy arguments of each engine whose
    rank 0 has a verified snapshot), ``pending`` (engines whose rank 0 has none yet: in check mode
    its download did not run, otherwise its download failed -- ``errors`` names them)."""
    items, pending, errors = [], [], []
    for engine in engines:
        if not copies_from_rank0(engine, source):
            continue
        head, name = engine["cluster"]["head"], engine["name"]
        found = _rank0_result(hostvars, head, name)
        files = found.get("files") or []
        addr = node_addr(hostvars, head)
        label = "engine %s, rank 0 on %s" % (name, head)
        if not found.get("commit") or not files or any(not f.get("sha256") for f in files) or not addr:
            pending.append(name)
            errors.append(
                "engine %s: rank 0 (%s) has no verified snapshot of %s to copy to this node (its download did not run"
                " or failed, or it has no uma_cluster_addr). Fix: see rank 0's model_fetch task and run again, or set"
                " vllm_service_model_source: hub to download on every node." % (name, head, engine["hub"]["repo_id"])
            )
            continue
        items.append({
            "name": name,
            "dest": engine["hub"]["dest"],
            "repo_id": engine["hub"]["repo_id"],
            "revision": engine["hub"]["revision"],
            "commit": found["commit"],
            "files": copy_files(files),
            "source": copy_url(addr, copy_port(engine)),
            "label": label,
            "key_file": link_key_file(engines_dir, name),
        })  # fmt: skip
    return {"items": items, "pending": pending, "errors": errors}


def servers(engines: List[Dict[str, Any]], hostvars: Any, source: Any, engines_dir: str,
            fetched: Any) -> List[Dict[str, Any]]:  # fmt: skip
    """The copy servers this host (rank 0) starts: one per engine whose other ranks lack the
    snapshot (their check, ``__vllm_service_copy_need``, reported a change), with how many."""
    commits = {}
    for result in fetched or []:
        if (result.get("item") or {}).get("name") and result.get("commit") and not result.get("skipped"):
            commits[result["item"]["name"]] = result["commit"]
    out = []
    for engine in engines:
        if not serves_copies(engine, source) or engine["name"] not in commits:
            continue
        peers = 0
        for node in engine["cluster"]["nodes"][1:]:
            need = _get(hostvars[node] if node in hostvars else {}, "__vllm_service_copy_need")
            for result in (_get(need, "results") or []) if need else []:
                if (result.get("item") or {}).get("name") == engine["name"] and result.get("changed"):
                    peers += 1
        addr = node_addr(hostvars, engine["cluster"]["head"])
        if peers and addr:
            out.append({
                "name": engine["name"],
                "dest": engine["hub"]["dest"],
                "repo_id": engine["hub"]["repo_id"],
                "commit": commits[engine["name"]],
                "bind": addr,
                "port": copy_port(engine),
                "peers": peers,
                "key_file": link_key_file(engines_dir, engine["name"]),
            })  # fmt: skip
    return out


def stand_ins(engines: List[Dict[str, Any]], hostvars: Any, source: Any, fetched: Any, copy_need: Any,
              pending: Any) -> Dict[str, Any]:  # fmt: skip
    """Check mode: engine name -> {config, weights_bytes} for each Hub engine whose model is not (whole)
    on this host yet, so that it is planned before the download (model_fetch's peek: the commit's
    config.json and the listed safetensors bytes). ``fetched``: this host's model_fetch results;
    ``copy_need``: its check of rank 0's snapshot (a rank that copies); ``pending``: the engines whose
    rank 0 has no verified snapshot yet (so neither has this rank). A model already whole here is
    planned from its directory as on a real run."""
    lacking = {(r.get("item") or {}).get("name") for r in copy_need or [] if r.get("changed")}
    out = {}
    for engine in engines:
        if not engine.get("hub") or engine.get("state") == "absent":
            continue
        name = engine["name"]
        if copies_from_rank0(engine, source):
            if name not in lacking and name not in (pending or []):
                continue
            found = _rank0_result(hostvars, engine["cluster"]["head"], name)
        else:
            found = loop_result(fetched, name)
            if not (found.get("download") or {}).get("files"):
                continue
        if isinstance(found.get("config"), dict):
            out[name] = {"config": found["config"], "weights_bytes": found.get("weights_bytes")}
    return out
