# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each engine's watchdog config on a node of the uma.vllm.vllm_service role
(``/etc/uma-vllm/watchdog/<engine>.json``, read by plugins/module_utils/node/watchdog/program.py).

Every config is checked by the watchdog's own validation (``_watchdog_logic.validate``)
before anything is written, so a bad value is refused on the controller naming the
option, the value and the fix, never by a watchdog that exits 78 on the node. Runs on the
controller only (filter vllm_service_watchdog_configs in plugins/filter/watchdog.py).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic
from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install
from ansible_collections.uma.vllm.plugins.module_utils.service.base import STATUS_PORT_OFFSET, api_url
from ansible_collections.uma.vllm.plugins.module_utils.service.engines import EngineModelError, container_name
from ansible_collections.uma.vllm.plugins.module_utils.service.files import link_key_file

# Role variable -> watchdog option (values given as null keep the watchdog's default).
OPTIONS = {
    "interval_s": "interval_s",
    "health_timeout_s": "health_timeout_s",
    "probe_timeout_s": "probe_timeout_s",
    "probe_idle_s": "probe_idle_s",
    "fail_threshold": "fail_threshold",
    "busy_stall_s": "busy_stall_s",
    "start_timeout_s": "start_timeout_s",
    "peer_timeout_s": "peer_timeout_s",
    "peer_ack_timeout_s": "peer_ack_timeout_s",
    "rank_link_grace_s": "rank_link_grace_s",
    "backoff_initial_s": "backoff_initial_s",
    "backoff_max_s": "backoff_max_s",
    "max_restarts": "max_restarts",
    "window_s": "window_s",
    "healthy_reset_s": "healthy_reset_s",
    "warn_floor_mib": "warn_floor_mib",
    "critical_floor_mib": "critical_floor_mib",
    "floor_samples": "floor_samples",
    "evict_every_s": "evict_every_s",
    "evict_scope": "evict_scope",
    "textfile_dir": "textfile_dir",
    "lock_memory": "lock_memory",
}
_BOOLEAN_TEXT = {"true": True, "yes": True, "false": False, "no": False}

# vLLM's process titles (vllm/utils/system_utils.py set_process_title): the engine core on the
# node that serves the API, the workers on the other ranks (VLLM::Worker_TP<n>).
RANK0_PROCESSES = [{"match": "VLLM::EngineCore", "min": 1}]
WORKER_PROCESSES = [{"match": "VLLM::Worker", "min": 1}]
PORT_OFFSET = STATUS_PORT_OFFSET  # status port = the engine's master_port + 11 (the rank link has + 10)


def _addr(hostvars: Any, host: str) -> Optional[str]:
    if host not in hostvars:
        return None
    hv = hostvars[host]
    node = hv.get("__vllm_service_node") if hasattr(hv, "get") else None
    if isinstance(node, dict) and node.get("addr"):
        return str(node["addr"])
    addr = hv.get("uma_cluster_addr") if hasattr(hv, "get") else None
    return str(addr) if addr else None


def _url(addr: str, port: int) -> str:
    host = "[%s]" % addr if ":" in addr else addr
    return "http://%s:%d/status" % (host, port)


def _number_or_none(option: str, value: Any) -> Any:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return value  # the watchdog's validation names it


def programs_fingerprint() -> str:
    """The fingerprint uma.vllm.node_files reports for the node programs it installs (the same content and rule):
    written into each watchdog's config, so that new programs change the config and the role restarts the
    running watchdogs (a Python process keeps the code it started with)."""
    return node_install.programs_fingerprint()


def base_config(
    name: str, engine: Dict[str, Any], item: Dict[str, Any], rank: int, settings: Dict[str, Any]
) -> Dict[str, Any]:
    """The node-local part of an engine's watchdog config: options, model, container, processes, API."""
    raw: Dict[str, Any] = {
        "_comment": settings.get("managed") or "Managed by uma.vllm (role vllm_service)",
        "engine": name,
        "rank": rank,
        "state_dir": settings.get("state_dir") or _paths.STATE_DIR,
        "unified_memory": str(settings.get("unified_memory")).lower() in ("true", "yes", "1"),
        "programs": programs_fingerprint(),
    }
    for key, option in OPTIONS.items():
        value = settings.get(key)
        if key == "lock_memory":
            # a YAML boolean, or its text from a template; anything else goes on to the watchdog's validation
            value = _BOOLEAN_TEXT.get(value.strip().lower(), value) if isinstance(value, str) else value
        elif key not in ("evict_scope", "textfile_dir"):
            value = _number_or_none("vllm_service_watchdog_" + key, value)
        if value is not None and value != "":
            raw[option] = value
    ram = _number_or_none("vllm_service_ram_gib", settings.get("ram_gib"))
    if ram is not None:
        raw["ram_gib"] = ram
    model_path = engine.get("model_path")
    if isinstance(model_path, str) and model_path.startswith("/"):
        raw["model_path"] = model_path
    if (engine.get("runtime") or settings.get("runtime")) == "container":
        raw["container"] = container_name(name)
        raw["container_bin"] = settings.get("container_bin") or "docker"
    processes = settings.get("processes")
    raw["processes"] = list(processes) if processes else (RANK0_PROCESSES if rank == 0 else WORKER_PROCESSES)
    if rank == 0:
        health = str(item.get("health_url") or api_url("127.0.0.1", engine.get("port")))
        raw["base_url"] = health[: -len("/health")] if health.endswith("/health") else health
    return raw


def cluster_config(
    raw: Dict[str, Any], engine: Dict[str, Any], rank: int, hostname: str, hostvars: Any, where: str
) -> None:
    """Where the watchdogs of a multi-node engine publish their status and whom they watch."""
    cluster = engine["cluster"]
    port = int(engine.get("watchdog_port") or int(cluster["master_port"]) + PORT_OFFSET)
    own = _addr(hostvars, hostname)
    if not own:
        raise EngineModelError(
            "%s: no cluster-link address for %s. Fix: set uma_cluster_addr for it (the watchdogs of a "
            "multi-node engine publish their status there)." % (where, hostname)
        )
    raw["status_bind"] = own
    raw["status_port"] = port
    if rank == 0:
        peers = []
        for node in cluster["nodes"][1:]:
            addr = _addr(hostvars, node)
            if not addr:
                raise EngineModelError(
                    "%s: no cluster-link address for peer %s. Fix: set uma_cluster_addr for it." % (where, node)
                )
            peers.append({"name": str(node), "url": _url(addr, port)})
        raw["peers"] = peers
    else:
        head = _addr(hostvars, cluster["head"])
        if not head:
            raise EngineModelError(
                "%s: no cluster-link address for rank 0 (%s). Fix: set uma_cluster_addr for it."
                % (where, cluster["head"])
            )
        raw["leader_url"] = _url(head, port)


def checked_floors(raw: Dict[str, Any], where: str) -> Dict[str, Any]:
    """The watchdog's own validation of ``raw``; its memory floors, or a refusal naming the role variable."""
    checked = {k: v for k, v in raw.items() if k != "_comment"}
    try:
        cfg = logic.validate(checked, where)
        ram_bytes = int(cfg["ram_gib"] * logic.GIB) if cfg.get("ram_gib") else 128 * logic.GIB
        return logic.size_floors(ram_bytes, cfg.get("warn_floor_mib"), cfg.get("critical_floor_mib"))
    except UmaError as err:
        option = err.option
        if option in OPTIONS.values():
            option = "vllm_service_watchdog_" + option
        elif option == "ram_gib":
            option = "vllm_service_ram_gib"
        raise EngineModelError("%s: %s = %r %s. Fix: %s" % (where, option, err.value, err.problem, err.fix)) from None


def watchdog_configs(
    launch: List[Dict[str, Any]],
    engines: List[Dict[str, Any]],
    hostname: str,
    hostvars: Any,
    settings: Dict[str, Any],
) -> List[Dict[str, Any]]:
    """``[{"name", "config", "floors"}]`` for this host's started engines (``launch`` = launch_configs)."""
    by_name = {str(e.get("name")): e for e in engines or []}
    out = []
    for item in launch or []:
        name = str(item["name"])
        engine = by_name.get(name) or {}
        if engine.get("state", "started") != "started":
            continue
        cluster = engine.get("cluster")
        rank = int(cluster["rank"]) if cluster else 0
        where = "vllm_service_watchdog (engine %s on %s)" % (name, hostname)
        raw = base_config(name, engine, item, rank, settings)
        if cluster:
            cluster_config(raw, engine, rank, hostname, hostvars, where)
            if settings.get("secrets_dir"):
                # the status is signed with the engine's link key, like the launchers' rank link
                raw["key_file"] = link_key_file(settings["secrets_dir"], name)
        out.append({"name": name, "config": raw, "floors": checked_floors(raw, where)})
    return out
