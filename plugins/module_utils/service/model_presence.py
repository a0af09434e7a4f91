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

Not done (named in the refusal): copying a ``model_path`` from the node that has it to the others;
the fix says how to do it by hand or to give the engine its Hub id.

Pure functions on plain data, controller only; the role reaches them through
plugins/filter/vllm_service.py (``vllm_service_model_presence``).
Tests: tests/unit/plugins/module_utils/test_vllm_service_model_presence.py.
"""

from __future__ import annotations

import shlex
from typing import Any, Dict, List

from ansible_collections.uma.vllm.plugins.module_utils.service.base import _err

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
    hv = hostvars[host] if host in hostvars else None
    stat = hv.get(STAT_VAR) if hv is not None and hasattr(hv, "get") else None
    results = stat.get("results") if isinstance(stat, dict) else None
    for result in results if isinstance(results, list) else []:
        if not isinstance(result, dict) or result.get("item") != path:
            continue
        if result.get("skipped") or result.get("failed"):
            return None
        found = result.get("stat") or {}
        return bool(found.get("exists")) and bool(found.get("isreg"))
    return None


def presence(engines: Any, hostvars: Any, this_host: Any) -> Dict[str, Any]:
    """``errors`` (refusals) and ``lines`` (per engine: the nodes that were not checked)."""
    errors: List[str] = []
    lines: Dict[str, List[str]] = {}
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
        quoted = shlex.quote(path.rstrip("/") + "/")
        copies = "; ".join("on %s: rsync -a --partial %s %s:%s" % (have[0], quoted, host, quoted) for host in lack)
        errors.append(_err(
            where, path,
            "is on %s but not on %s (no config.json there); every node of the engine loads it"
            % (", ".join(have), ", ".join(lack)),
            "Copy it to the same path over the cluster link (%s), or give the engine model: OWNER/NAME (downloaded"
            " once, copied and verified by the role). The role does not copy a model_path itself." % copies,
        ))  # fmt: skip
    return {"errors": errors, "lines": lines}
