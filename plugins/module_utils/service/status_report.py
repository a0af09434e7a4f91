# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What playbooks/status.yml shows per engine and rank: the unit, the watchdog's phase, the last
restart and why, memory and the URL, the model, the vLLM release, KV tokens and utilization of the
plan, and for the container runtime the rank's container (image, image id and registry digest, state,
the memory of its own cgroup), from what playbooks/files/status_node.py read on the node.
Pure; the filter uma.vllm.status_report (plugins/filter/status.py) wraps it. Tests:
tests/unit/plugins/module_utils/test_status_report.py.
"""

from __future__ import annotations

from typing import Any, Dict, Optional
from urllib.parse import urlsplit, urlunsplit

LOOPBACK = ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::")


def _mib(value: Any) -> Optional[int]:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None  # systemd says [not set] without memory accounting
    return number // (1024 * 1024) if 0 <= number < 2**63 - 1 else None


def api_url(health_url: Any, rank: Any, host: str) -> Optional[str]:
    """The OpenAI API base a client uses (rank 0 / single node only), with the node's address for loopback."""
    if rank not in (None, 0) or not isinstance(health_url, str) or not health_url.startswith("http"):
        return None
    parts = urlsplit(health_url)
    netloc = parts.netloc
    if parts.hostname in LOOPBACK:
        netloc = "%s:%s" % ("[%s]" % host if ":" in host else host, parts.port) if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rsplit("/health", 1)[0] + "/v1", "", ""))


def engine_status(name: str, seen: Dict[str, Any], host: str, defined: bool) -> Dict[str, Any]:
    unit = seen.get("unit") or {}
    watchdog_unit = seen.get("watchdog_unit") or {}
    watchdog = seen.get("watchdog") or {}
    last = seen.get("last_restart") or {}
    launch = seen.get("last_launch") or {}
    rank = seen.get("rank")
    plan = seen.get("plan") if isinstance(seen.get("plan"), dict) else {}
    box = seen.get("container") if isinstance(seen.get("container"), dict) else None
    return {
        "engine": name,
        "host": host,
        "rank": "single node" if rank is None else "rank %s of %s" % (rank, seen.get("nnodes")),
        "unit": "%s (%s)" % (unit.get("ActiveState", "unknown"), unit.get("SubState", "?")),
        "restarts_by_systemd": unit.get("NRestarts"),
        "since": unit.get("ActiveEnterTimestamp") or None,
        "memory_mib": _mib(unit.get("MemoryCurrent")),
        "watchdog": (watchdog.get("phase") or ("not running" if watchdog_unit.get("ActiveState") != "active" else "?")),
        "watchdog_reason": watchdog.get("reason"),
        "watchdog_status": watchdog_unit.get("StatusText") or None,
        "restarts_in_window": watchdog.get("restarts_in_window"),
        "last_restart": ("%s at %s: %s" % (last.get("action"), last.get("at"), last.get("reason"))) if last else None,
        "last_launch": launch or None,
        "health_url": seen.get("health_url"),
        "health": seen.get("health"),
        "url": api_url(seen.get("health_url"), rank, host),
        "gave_up": watchdog.get("phase") == "gave_up",
        "in_inventory": defined,
        "model": seen.get("model"),
        "vllm_version": plan.get("vllm_version"),
        "kv_tokens": plan.get("kv_tokens"),
        "gpu_memory_utilization": plan.get("gpu_memory_utilization"),
        "container": None if box is None else {
            "name": box.get("name"), "state": box.get("state"), "image": box.get("image"),
            "image_id": box.get("image_id"), "digests": list(box.get("digests") or []),
            "memory_mib": _mib(box.get("memory")),
        },
    }  # fmt: skip


def _plan_line(e: Dict[str, Any]) -> Optional[str]:
    parts = []
    if e["model"]:
        parts.append("model %s" % e["model"])
    if e["vllm_version"]:
        parts.append("vLLM %s" % e["vllm_version"])
    if isinstance(e["kv_tokens"], int) and not isinstance(e["kv_tokens"], bool):
        parts.append("planned KV %s tokens" % format(e["kv_tokens"], ","))
    if e["gpu_memory_utilization"] is not None:
        parts.append("--gpu-memory-utilization %s" % e["gpu_memory_utilization"])
    return "    " + ", ".join(parts) if parts else None


def _container_line(box: Optional[Dict[str, Any]]) -> Optional[str]:
    if box is None:
        return None
    if box["state"] == "absent":
        return "    container %s: none" % box["name"]
    image_id = str(box["image_id"] or "?")
    digest = ", ".join(box["digests"]) if box["digests"] else "no registry digest (loaded, not pulled)"
    memory = "%s MiB" % box["memory_mib"] if box["memory_mib"] is not None else "- MiB"
    return "    container %s %s, memory %s (its cgroup); image %s (id %s; %s)" % (
        box["name"], box["state"], memory, box["image"], image_id[:19], digest)  # fmt: skip


def status_report(node: Any, host: str, defined: Any) -> Dict[str, Any]:
    """``node``: status_node.py's JSON; ``host``: the node's address for clients; ``defined``: the engine
    names the inventory gives this host. Returns engines (a list) and lines to print."""
    node = node if isinstance(node, dict) else {}
    memory = node.get("memory") or {}
    engines = [
        engine_status(name, seen if isinstance(seen, dict) else {}, host, name in (defined or []))
        for name, seen in sorted((node.get("engines") or {}).items())
    ]
    lines = []
    if memory:
        lines.append(
            "%s: MemAvailable %.1f of %.1f GiB"
            % (host, memory.get("MemAvailable_kb", 0) / 1048576.0, memory.get("MemTotal_kb", 0) / 1048576.0)
        )
    for e in engines:
        lines.append(
            "%s %s: unit %s since %s, memory %s MiB, systemd restarts %s; watchdog %s%s; health %s%s"
            % (e["engine"], e["rank"], e["unit"], e["since"] or "-",
               e["memory_mib"] if e["memory_mib"] is not None else "-", e["restarts_by_systemd"] or "0",
               e["watchdog"], (" (%s)" % e["watchdog_reason"]) if e["watchdog_reason"] else "",
               e["health"] if e["health"] is not None else "-", ("; API %s" % e["url"]) if e["url"] else "")
        )  # fmt: skip
        for extra in (_plan_line(e), _container_line(e["container"])):
            if extra:
                lines.append(extra)
        if e["last_restart"]:
            lines.append("    last restart: %s" % e["last_restart"])
        if e["gave_up"]:
            lines.append(
                "    GAVE UP: every rank was stopped and stays stopped. Fix the cause (journalctl -u uma-vllm@%s,"
                " playbooks/diagnose.yml), then start it again on every rank: ansible-playbook site.yml"
                " (docs/OPERATIONS.md)" % e["engine"]
            )
        if not e["in_inventory"]:
            lines.append("    not in vllm_service_engines for this host (vllm_service_prune=remove removes it)")
    if not engines:
        lines.append("%s: no engine installed" % host)
    return {"engines": engines, "lines": lines}
