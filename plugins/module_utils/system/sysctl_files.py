# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sysctl files on a node: the live values under /proc/sys, how systemd-sysctl orders the
drop-in files, who wins at boot, and byte-exact put-back for a rollback.

Part of ``_sysctl`` (uma.vllm.uma_sysctl and the engine watchdog), a node program: it ships
beside ``system/sysctl.py`` (roles/launch_wrapper/vars/main.yml).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import (
    UmaError,
    atomic_write,
    managed_header,
    parse_fingerprint,
    read_text,
)


def key_file(proc_root: str, key: str) -> str:
    return os.path.join(proc_root, "sys", *key.split("."))


def normalize_key(key: str) -> str:
    return key.strip().lstrip("-").replace("/", ".")


def normalize_value(value: Any) -> str:
    return " ".join(str(value).split())


def parse_sysctl_text(text: str) -> Dict[str, str]:
    """Key/value pairs of a sysctl.d file, later lines winning (like systemd-sysctl)."""
    result: Dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            continue
        result[normalize_key(key)] = normalize_value(value)
    return result


def boot_order(dirs: List[str], sysctl_conf: Optional[str]) -> List[str]:
    """Files in the order systemd-sysctl applies them (last wins per key).

    Files with the same name: the one in the earliest directory shadows the
    others. /etc/sysctl.conf is applied last by ``sysctl --system`` (procps);
    on Debian systemd reads it through the 99-sysctl.conf link.
    """
    chosen: Dict[str, str] = {}
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            full = os.path.join(directory, name)
            if name.endswith(".conf") and name not in chosen and (os.path.isfile(full) or os.path.islink(full)):
                chosen[name] = full
    ordered = [chosen[name] for name in sorted(chosen)]
    if sysctl_conf and os.path.isfile(sysctl_conf):
        real = os.path.realpath(sysctl_conf)
        if all(os.path.realpath(p) != real for p in ordered):
            ordered.append(sysctl_conf)
    return ordered


def find_conflicts(path: str, keys: List[str], dirs: List[str], sysctl_conf: Optional[str]) -> List[Dict[str, Any]]:
    """Other files that set our keys, and whether they win at boot.

    systemd-sysctl applies files sorted by name, so a file whose name sorts
    after ours overrides our keys; a file with our name in a directory searched
    earlier masks ours entirely; /etc/sysctl.conf comes last under procps.
    """
    own = os.path.realpath(path)
    name = os.path.basename(path)
    own_dir = os.path.dirname(own)
    dir_rank = {os.path.realpath(d): i for i, d in enumerate(dirs)}
    conflicts = []
    for candidate in boot_order(dirs, sysctl_conf):
        if os.path.realpath(candidate) == own or not os.path.isfile(candidate):
            continue  # a dangling or looping link, or a directory named *.conf: systemd-sysctl skips it too
        try:
            text = read_text(candidate)
        except OSError:
            continue
        if text is None:
            continue
        settings = parse_sysctl_text(text)
        cand_name = os.path.basename(candidate)
        if candidate == sysctl_conf:
            wins, reason = True, "applied last by sysctl --system"
        elif cand_name == name:
            cand_rank = dir_rank.get(os.path.realpath(os.path.dirname(candidate)), len(dirs))
            wins = cand_rank < dir_rank.get(own_dir, len(dirs))
            reason = "same file name in a directory searched earlier masks ours" if wins else "masked by ours"
        elif cand_name > name:
            wins, reason = True, "applied after ours"
        else:
            wins, reason = False, "applied before ours (ours wins)"
        for key in keys:
            if key in settings or (cand_name == name and wins):
                conflicts.append(
                    {"path": candidate, "key": key, "value": settings.get(key), "wins_at_boot": wins, "reason": reason}
                )
    return conflicts


def raw_bytes(path: str) -> Optional[bytes]:
    """Exact bytes of a file (None when absent), to put it back on rollback."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def missing_dirs(path: str) -> List[str]:
    """Ancestors of path that do not exist yet, deepest first (atomic_write creates them)."""
    out = []
    directory = os.path.dirname(os.path.abspath(path))
    while directory and not os.path.lexists(directory):
        out.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return out


def put_back(path: str, raw: Optional[bytes], mode: int) -> None:
    if raw is None:
        if os.path.lexists(path):
            os.unlink(path)
        return
    atomic_write(path, raw, mode)


def read_live(proc_root: str, keys: List[str]) -> Dict[str, Optional[str]]:
    live: Dict[str, Optional[str]] = {}
    for key in keys:
        path = key_file(proc_root, key)
        try:
            text = read_text(path)
        except OSError as err:
            raise UmaError(
                "proc_root",
                proc_root,
                "%s (the live %s) cannot be read (%s)" % (path, key, err.strerror),
                "Point proc_root at the node's /proc.",
            ) from None
        live[key] = None if text is None else normalize_value(text)
    return live


def write_live(proc_root: str, key: str, value: str) -> None:
    path = key_file(proc_root, key)
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(value + "\n")
    except (OSError, UnicodeError) as err:
        raise UmaError(
            key,
            value,
            "was refused: %s could not be written (%s)" % (path, getattr(err, "strerror", None) or err),
            "Run with become: true, or set apply=false to only write the file.",
        ) from None


def render_file(values: Dict[str, str], sizing: Dict[str, Any]) -> str:
    body_lines = [
        "# vm.min_free_kbytes: %s (%s, RAM %.1f GiB from %s)"
        % (values["vm.min_free_kbytes"], sizing["rule"], sizing["ram_gib"], sizing.get("ram_source", "?")),
    ]
    body_lines += ["%s = %s" % (key, values[key]) for key in sorted(values)]
    body = "\n".join(body_lines) + "\n"
    return managed_header("uma.vllm.uma_sysctl, vm page reserve and cache settings for vLLM", body) + body


def file_drift(current: Optional[str], wanted: Optional[str]) -> Optional[str]:
    if current == wanted:
        return None
    if current is None:
        return "missing"
    if wanted is None:
        return "present"
    check = parse_fingerprint(current)
    if check is None:
        return "header removed or file replaced"
    if not check["intact"]:
        return "edited by hand (fingerprint mismatch)"
    return "settings differ"
