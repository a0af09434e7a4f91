# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every file the vllm_service role keeps on a node, as one ``uma.vllm.node_files`` call, and
what that call's result means for the engines (which were written, the fingerprint each
engine runs with, which watchdogs must restart).

The role renders the texts (templates with ``ansible_managed``, JSON with ansible-core's
``to_nice_json``) and hands them here; these functions only arrange them and read the result.
Pure; filters in plugins/filter/vllm_service.py; tests in
tests/unit/plugins/module_utils/test_vllm_service_files.py.

Fingerprint of an engine (kept in ``<state_dir>/vllm-service.json`` by the role, compared on
the next run): the sha1 checksums of the template unit, its drop-in, its EnvironmentFile and
its launcher config joined by ``/`` -- the same text the role wrote before it used node_files,
so engines started by an older release do not restart for the upgrade alone.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List

DIR_MODE = "0755"


def _dirs(paths: List[str]) -> List[Dict[str, Any]]:
    return [{"path": p, "mode": DIR_MODE} for p in paths]


def drop_in_dir(paths: Dict[str, Any], name: str) -> str:
    return "%s/uma-vllm@%s.service.d" % (paths["systemd_dir"], name)


def link_key_file(secrets_dir: str, name: str) -> str:
    """Where a multi-node engine's link key lives on each of its nodes (the launcher's and the
    watchdog's ``key_file``; the role writes it, 0600 root, from the key made on the controller)."""
    return "%s/%s.link.key" % (str(secrets_dir).rstrip("/"), name)


def link_key_dir_errors(value: Any, engines: List[Dict[str, Any]]) -> List[str]:
    """vllm_service_link_key_dir (the controller's directory of the engines' link keys), checked when
    a multi-node engine needs a key: an absolute path without control characters."""
    if not any(len(e.get("nodes") or []) > 1 and e.get("state", "started") != "absent" for e in engines or []):
        return []
    if not isinstance(value, str) or not value.startswith("/") or any(ord(c) <= 32 or ord(c) == 127 for c in value):
        return [
            "vllm_service_link_key_dir = %r is not an absolute path without spaces on the controller. Fix: give "
            "the directory "
            "where the engines' link keys are made and kept, e.g. /home/me/.uma-vllm-keys (never in git)." % (value,)
        ]
    return []


def engine_paths(paths: Dict[str, Any], name: str) -> Dict[str, str]:
    """Where one engine's files live."""
    return {
        "drop_in": drop_in_dir(paths, name) + "/10-uma-vllm.conf",
        "env": "%s/%s.env" % (paths["engines_dir"], name),
        # a container engine's secrets as sh assignments, mounted read-only into its container
        "container_env": "%s/%s.container.env" % (paths["engines_dir"], name),
        "config": "%s/%s.json" % (paths["engines_dir"], name),
        # a multi-node engine's link key (the rank link and the watchdogs' status are signed with it)
        "link_key": link_key_file(paths["engines_dir"], name),
        "watchdog": "%s/%s.json" % (paths["watchdog_dir"], name),
    }


def node_files(
    renders: List[Dict[str, Any]],
    launch_files: List[Dict[str, Any]],
    watchdogs: List[Dict[str, Any]],
    paths: Dict[str, Any],
    render_json: Callable[[Any], str],
) -> Dict[str, List[Dict[str, Any]]]:
    """The arguments of the role's ``uma.vllm.node_files`` task.

    ``renders``: the registered results of the loop that rendered each engine's drop-in and
    EnvironmentFile (``item`` the engine, ``ansible_facts.__vllm_service_rendered`` the texts);
    ``launch_files``: launch_wrapper_engine_files entries; ``watchdogs``: the
    vllm_service_watchdog_configs entries (``name``, ``config``); ``paths``: the role's paths and
    the rendered template units (``unit_content``, ``watchdog_unit_content``)."""
    names = [r["item"]["name"] for r in renders]
    # the config dir first: launch_wrapper creates it too, but not in check mode on a fresh node
    directories = _dirs(
        [paths["config_dir"], paths["engines_dir"], paths["state_dir"]] + [drop_in_dir(paths, n) for n in names]
    )
    files = [
        {"path": "%s/%s" % (paths["systemd_dir"], paths["unit"]), "mode": "0644", "content": paths["unit_content"]}
    ]
    secret_files = []
    for result in renders:
        name, text = result["item"]["name"], result["ansible_facts"]["__vllm_service_rendered"]
        where = engine_paths(paths, name)
        files.append({"path": where["drop_in"], "mode": "0644", "content": text["drop_in"]})
        secret_files.append({"path": where["env"], "mode": "0600", "content": text["env"]})
        if text.get("container_env"):
            secret_files.append({"path": where["container_env"], "mode": "0600", "content": text["container_env"]})
        if text.get("link_key"):
            secret_files.append({"path": where["link_key"], "mode": "0600", "content": text["link_key"] + "\n"})
    files.extend(launch_files)
    if watchdogs:
        directories.extend(_dirs([paths["watchdog_dir"]]))
        unit = "%s/%s" % (paths["systemd_dir"], paths["watchdog_unit"])
        files.append({"path": unit, "mode": "0644", "content": paths["watchdog_unit_content"]})
        for item in watchdogs:
            path = engine_paths(paths, item["name"])["watchdog"]
            files.append({"path": path, "mode": "0644", "content": render_json(item["config"]) + "\n"})
    return {"directories": directories, "files": files, "secret_files": secret_files}


def _entry(result: Dict[str, Any], path: str) -> Dict[str, Any]:
    return ((result or {}).get("files") or {}).get(path) or {}


def files_state(engines: List[Dict[str, Any]], result: Dict[str, Any], paths: Dict[str, Any]) -> Dict[str, Any]:
    """What the node_files result says per engine: its fingerprint, whether this run wrote any of
    its files, whether the template unit or a drop-in changed (systemd must reload), and which
    watchdogs must restart (their config or the watchdog unit was written)."""
    unit = _entry(result, "%s/%s" % (paths["systemd_dir"], paths["unit"]))
    watchdog_unit = _entry(result, "%s/%s" % (paths["systemd_dir"], paths["watchdog_unit"]))
    fingerprints: Dict[str, str] = {}
    written: List[str] = []
    drop_in_changed = False
    watchdogs: List[str] = []
    for engine in engines:
        name = engine["name"]
        where = engine_paths(paths, name)
        parts = [_entry(result, where[key]) for key in ("drop_in", "env", "config")]
        fingerprints[name] = "/".join(str(p) for p in [unit.get("checksum")] + [e.get("checksum") for e in parts])
        # a new link key (rotated on the controller) restarts every rank and its watchdog
        key_changed = bool(_entry(result, where["link_key"]).get("changed"))
        if any(e.get("changed") for e in parts) or _entry(result, where["container_env"]).get("changed") or key_changed:
            written.append(name)
        drop_in_changed = drop_in_changed or bool(parts[0].get("changed"))
        if watchdog_unit.get("changed") or _entry(result, where["watchdog"]).get("changed") or key_changed:
            watchdogs.append(name)
    return {
        "fingerprints": fingerprints,
        "written": written,
        "unit_changed": bool(unit.get("changed")),
        "reload": bool(unit.get("changed") or watchdog_unit.get("changed") or drop_in_changed),
        "watchdogs_changed": watchdogs,
    }


def file_as_wanted(pair: Any, mode: str, uid: int, gid: int) -> bool:
    """``(content, seen)`` -> does the node already have exactly this file: ``seen`` is what
    uma.vllm.engine_facts's ``files`` reported for its path (a regular file, not a link), its sha256 is
    that of ``content`` (UTF-8), and its mode and owner are ``mode`` ("0644"), ``uid`` and ``gid``.
    False for anything else (nothing there, unreadable, a symlink, another mode or owner): the role
    then runs its write task, which corrects it and reports the change."""
    try:
        content, seen = pair
    except (TypeError, ValueError):
        return False
    if not isinstance(content, str) or not isinstance(seen, dict) or seen.get("kind") != "file":
        return False
    return (
        seen.get("sha256") == hashlib.sha256(content.encode("utf-8")).hexdigest()
        and seen.get("mode") == mode
        and seen.get("uid") == uid
        and seen.get("gid") == gid
    )
