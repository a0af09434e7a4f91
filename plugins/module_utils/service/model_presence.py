# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every node of an engine has the engine's ``model_path`` before anything changes (issue 34 item 3b).

A model the owner put on one Spark only (the common case: downloaded on the head node) used to be
refused by the planner on the node without it, while rank 0's node went on (rewrote its files and
started a rank that waited for a peer that never came). Each node now looks for
``<model_path>/config.json`` (one ``stat`` per path, in ``--check`` too) and every node of the
engine reads what the others found; an engine whose model is missing on some of its nodes is
refused on all of them, naming the nodes without it, those with it, and the fix. A node that is
not in this play (``--limit``) or failed before is named as not checked. A Hub model
(``model: OWNER/NAME``) is not looked for here: the role downloads it once and copies it over the
cluster link (models.yml, models_copy.yml).

Where some nodes have it and others do not, the role copies it (``vllm_service_model_path_copy``,
true by default): the lowest rank that has it indexes the directory (``uma.vllm.model_copy`` mode
index: names, sizes, sha256), serves exactly those files over the cluster link (signed with the
engine's link key, bounded, read-only) and the others copy and check each file, config.json last,
so a node with config.json has the whole model (an interrupted copy is found again and resumed).
In ``--check`` nothing is hashed or copied: the plan on a node without the model is made from the
source's config.json and weight bytes, and the run says what would be copied. With
``vllm_service_model_path_copy: false`` the engine is refused, naming the nodes and the copy command.

Pure functions on plain data, controller only; the role reaches them through
plugins/filter/vllm_service.py (``vllm_service_model_presence``).
Tests: tests/unit/plugins/module_utils/test_vllm_service_model_presence.py.
"""

from __future__ import annotations

import shlex
from typing import Any, Dict, List

from ansible_collections.uma.vllm.plugins.module_utils.service.base import COPY_PORT_OFFSET, _err
from ansible_collections.uma.vllm.plugins.module_utils.service.files import link_key_file
from ansible_collections.uma.vllm.plugins.module_utils.service.hub_copy import (
    copy_files,
    copy_url,
    host_var,
    loop_result,
    node_addr,
)

STAT_VAR = "__vllm_service_model_stat"


def looked_for(engines: Any) -> List[Dict[str, Any]]:
    """This host's engines whose ``model_path`` is looked for: not absent, not a Hub model."""
    return [
        e for e in engines or []
        if isinstance(e, dict) and e.get("state") != "absent" and not e.get("hub")
        and isinstance(e.get("model_path"), str) and e["model_path"].startswith("/")
    ]  # fmt: skip


def paths(engines: Any) -> List[str]:
    """The model paths a node stats (``<path>/config.json``), each once: looked_for's, sorted."""
    return sorted({e["model_path"] for e in looked_for(engines)})


def _found(hostvars: Any, host: str, path: str) -> Any:
    """True / False for the model at ``path`` on ``host``, None when that host did not look."""
    stat = host_var(hostvars, host, STAT_VAR)
    results = stat.get("results") if isinstance(stat, dict) else None
    for result in results if isinstance(results, list) else []:
        if not isinstance(result, dict) or result.get("item") != path:
            continue
        if result.get("skipped") or result.get("failed"):
            return None
        found = result.get("stat") or {}
        return bool(found.get("exists")) and bool(found.get("isreg"))
    return None


def presence(engines: Any, hostvars: Any, this_host: Any, copy: Any = False) -> Dict[str, Any]:
    """``errors`` (refusals), ``lines`` (per engine: the nodes that were not checked, the copy) and,
    with ``copy``, ``copies``: each engine of this host whose model the role copies (name, path, the
    source node, the nodes that lack it, the copy port)."""
    errors: List[str] = []
    lines: Dict[str, List[str]] = {}
    copies: List[Dict[str, Any]] = []
    for engine in looked_for(engines):
        name, path = str(engine.get("name")), engine["model_path"]
        cluster = engine.get("cluster")
        nodes = [str(h) for h in (cluster.get("nodes") or [])] if isinstance(cluster, dict) else [str(this_host)]
        have, lack = [], []
        for host in nodes:
            found = _found(hostvars, host, path)
            if found is None:
                lines.setdefault(name, []).append(
                    "model preflight: host %s not checked (not in this play, or it failed before)" % host
                )
            else:
                (have if found else lack).append(host)
        if not lack:
            continue
        where = "vllm_service_engines[%s].model_path" % name
        if not have:
            errors.append(_err(
                where, path, "has no config.json on %s" % ", ".join(lack),
                "Put the model directory (a Hugging Face model: config.json beside the weights) at %s on %s, or"
                " give the engine model: OWNER/NAME (the role downloads it once and copies it to the other nodes"
                " over the cluster link)." % (path, " and ".join(lack)),
            ))  # fmt: skip
            continue
        if copy is True and isinstance(cluster, dict) and cluster.get("master_port"):
            # engines that share the directory (the same nodes lacking it) share one copy: the first's key and port
            same = [c for c in copies if c["path"] == path and c["source"] == have[0] and c["lack"] == lack]
            if same:
                same[0]["engines"].append(name)
            else:
                copies.append({
                    "name": name, "engines": [name], "path": path, "source": have[0], "lack": lack,
                    "port": int(cluster["master_port"]) + COPY_PORT_OFFSET,
                })  # fmt: skip
            lines.setdefault(name, []).append(
                "model: %s is on %s only; the role copies it from %s to %s over the cluster link (checked: names,"
                " sizes, sha256)" % (path, ", ".join(have), have[0], ", ".join(lack))
            )
            continue
        quoted = shlex.quote(path.rstrip("/") + "/")
        commands = "; ".join("on %s: rsync -a --partial %s %s:%s" % (have[0], quoted, host, quoted) for host in lack)
        errors.append(_err(
            where, path,
            "is on %s but not on %s (no config.json there); every node of the engine loads it"
            % (", ".join(have), ", ".join(lack)),
            "Copy it to the same path over the cluster link (%s), or give the engine model: OWNER/NAME (downloaded"
            " once, copied and verified by the role), or set vllm_service_model_path_copy: true (the role copies it"
            " over the cluster link)." % commands,
        ))  # fmt: skip
    return {"errors": errors, "lines": lines, "copies": copies}


# --------------------------------------------------------------------------
# the copy of a model_path from the node that has it (models_path_copy.yml)

INDEX_VAR = "__vllm_service_path_index"


def _index_of(hostvars: Any, source: str, name: str) -> Dict[str, Any]:
    """The source node's index result for the engine (its model_copy mode index), {} when none."""
    registered = host_var(hostvars, source, INDEX_VAR)
    found = loop_result(registered.get("results") if isinstance(registered, dict) else None, name)
    return found if not found.get("failed") and isinstance(found.get("files"), list) else {}


def indexes(copies: Any, this_host: Any) -> List[Dict[str, Any]]:
    """The copies whose source is this host (it indexes, then serves, the directory)."""
    return [c for c in copies or [] if c.get("source") == this_host]


def receives(copies: Any, hostvars: Any, this_host: Any, engines_dir: str) -> Dict[str, Any]:
    """What this host copies: ``items`` (model_copy receive arguments), ``errors`` (a source without an index)."""
    items, errors = [], []
    for c in copies or []:
        if this_host not in c.get("lack", []):
            continue
        found, addr = _index_of(hostvars, c["source"], c["name"]), node_addr(hostvars, c["source"])
        files = found.get("files") or []
        if not found.get("commit") or not files or not addr:
            errors.append(
                "engine %s: %s has no index of %s to copy to this node (its index task failed, or it has no"
                " uma_cluster_addr). Fix: see %s's index task and run again."
                % (c["name"], c["source"], c["path"], c["source"])
            )
            continue
        items.append({
            "name": c["name"], "dest": c["path"], "repo_id": "local/%s" % c["name"], "revision": "local",
            "commit": found["commit"], "source": copy_url(addr, c["port"]),
            "files": copy_files(files),
            "label": "engine %s, %s on %s" % (c["name"], c["path"], c["source"]),
            "key_file": link_key_file(engines_dir, c["name"]),
        })  # fmt: skip
    return {"items": items, "errors": errors}


def servers(copies: Any, hostvars: Any, this_host: Any, engines_dir: str) -> List[Dict[str, Any]]:
    """The copy servers this host starts: one per copy it is the source of, for the nodes that lack it."""
    out = []
    for c in indexes(copies, this_host):
        found, addr = _index_of(hostvars, this_host, c["name"]), node_addr(hostvars, this_host)
        if found.get("commit") and addr:
            out.append({
                "name": c["name"], "dest": c["path"], "repo_id": "local/%s" % c["name"], "commit": found["commit"],
                "files": copy_files(found["files"]),
                "bind": addr, "port": c["port"], "peers": len(c["lack"]),
                "key_file": link_key_file(engines_dir, c["name"]),
            })  # fmt: skip
    return out


def stand_ins(copies: Any, hostvars: Any, this_host: Any) -> Dict[str, Any]:
    """Engine name -> {config, weights_bytes} from the source's index, for the planner on this host
    where the model is not yet (check mode: nothing was copied)."""
    out = {}
    for c in copies or []:
        found = _index_of(hostvars, c["source"], c["name"])
        if this_host in c.get("lack", []) and isinstance(found.get("config"), dict):
            for name in c["engines"]:
                out[name] = {"config": found["config"], "weights_bytes": found.get("weights_bytes")}
    return out
