# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the vllm_service role reads about its engines on a node, in one pass (module
``uma.vllm.engine_facts``): the engines installed (drop-in directories), the watchdog configs,
the stamps of what each running engine was started with, and the engines' unit states from one
``systemctl show``; on request also other units' states (in the same call), what is at some paths
(kind, mode, owner, sha256), the text of small files and which packages dpkg lacks, so that a no-op
re-run of the role needs no task of its own for its firewall or the port range (issue 34 item 7).

Read-only. ``systemctl`` runs through an injected *runner* ``runner(argv) -> (rc, stdout,
stderr)`` (the module passes ``AnsibleModule.run_command``) so the unit tests fake it
(tests/unit/plugins/module_utils/test_engine_facts.py). Nothing here imports Ansible.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat as _stat
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, check_path, read_text
from ansible_collections.uma.vllm.plugins.module_utils.service.state import unit_states
from ansible_collections.uma.vllm.plugins.module_utils.system import packages as _packages

Runner = Callable[[List[str]], Tuple[int, str, str]]

DEFAULT_SYSTEMD_DIR = "/etc/systemd/system"
DEFAULT_STAMPS_PATH = os.path.join(_paths.STATE_DIR, "vllm-service.json")
UNIT_PREFIX = "uma-vllm@"
WATCHDOG_PREFIX = "uma-vllm-watchdog@"
DROP_IN_SUFFIX = ".service.d"
WATCHDOG_SUBDIR = "watchdog"
# what the role's "Read the engines' unit states" task asked for
SHOW_PROPERTIES = ("Id", "ActiveState", "UnitFileState")
# the most of a file option ``read`` returns (its files are /proc values and small configs)
READ_LIMIT = 65536
_UNIT_NAME_RE = re.compile(r"^[A-Za-z0-9:_.@-]{1,200}\.(service|socket|timer|target|path|mount)$")
# systemctl show of a unit it cannot find exits 0 on systemd 252 (the lab's; measured), with
# ActiveState=inactive. Other versions may exit non-zero saying so; that output still parses.
_NOT_FOUND_RE = re.compile(r"not[- ]found|could not be found|not loaded|no such unit", re.IGNORECASE)
_ENGINE_RE = re.compile(_paths.ENGINE_NAME_PATTERN)
ENGINE_NAME_FIX = (
    "Use 1-64 characters from A-Z a-z 0-9 _ . - starting with a letter or digit, "
    "as in vllm_service_engines (e.g. 'llama70b')."
)


def is_engine_name(value: object) -> bool:
    return isinstance(value, str) and _ENGINE_RE.fullmatch(value) is not None


def check_engines(value: Any) -> List[str]:
    """The ``engines`` option: a list of engine names, each one checked; duplicates dropped."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise UmaError("engines", value, "is not a list", "Give a list of engine names, e.g. [llama70b].")
    out: List[str] = []
    for index, name in enumerate(value):
        if not is_engine_name(name):
            raise UmaError("engines[%d]" % index, name, "is not an engine name", ENGINE_NAME_FIX)
        if name not in out:
            out.append(name)
    return out


def check_request(params: Dict[str, Any]) -> Dict[str, Any]:
    """The module's options, checked: absolute paths without NUL or line breaks, engine names."""
    request = {}
    for option, fix in (
        ("systemd_dir", "Give systemd's unit directory, e.g. /etc/systemd/system."),
        ("config_dir", "Give the collection's config directory, e.g. %s." % _paths.CONFIG_DIR),
        ("stamps_path", "Give the vllm_service stamps file, e.g. %s." % DEFAULT_STAMPS_PATH),
    ):
        request[option] = check_path(option, params.get(option), fix=fix)
    request["engines"] = check_engines(params.get("engines"))
    request["watchdog_units"] = bool(params.get("watchdog_units"))
    for option, example in (
        ("files", "/etc/uma-vllm/firewall.nft"),
        ("read", "/proc/sys/net/ipv4/ip_local_port_range"),
    ):
        value = params.get(option) or []
        if not isinstance(value, list):
            raise UmaError(
                option, value, "is not a list of paths", "Give a list of absolute paths, e.g. [%s]." % example
            )
        request[option] = [check_path(option, path, fix="Give absolute paths, e.g. %s." % example) for path in value]
    units = params.get("extra_units") or []
    if not isinstance(units, list):
        raise UmaError("extra_units", units, "is not a list of unit names", "Give e.g. [uma-vllm-firewall.service].")
    for index, unit in enumerate(units):
        if not isinstance(unit, str) or not _UNIT_NAME_RE.match(unit):
            raise UmaError(
                "extra_units[%d]" % index, unit, "is not a systemd unit name", "Give e.g. uma-vllm-firewall.service."
            )
    request["extra_units"] = list(dict.fromkeys(units))
    request["packages"] = _packages.check_names("packages", params.get("packages") or [])
    request["dpkg_status"] = check_path(
        "dpkg_status",
        params.get("dpkg_status") or _packages.DPKG_STATUS,
        fix="Give dpkg's status file, e.g. /var/lib/dpkg/status.",
    )
    return request


def file_facts(paths: List[str]) -> Dict[str, Dict[str, Any]]:
    """Per path what is there, as ansible.builtin.stat (not followed) and copy compare it: ``exists``
    (a dangling symlink counts), ``kind``, ``mode`` ("0644"), ``uid``, ``gid``, and ``sha256`` of a
    regular file's content (None for anything else, or when it cannot be read)."""
    out: Dict[str, Dict[str, Any]] = {}
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            out[path] = {"exists": False, "kind": None, "mode": None, "uid": None, "gid": None, "sha256": None}
            continue
        kind = (
            "file"
            if _stat.S_ISREG(st.st_mode)
            else "link"
            if _stat.S_ISLNK(st.st_mode)
            else "directory"
            if _stat.S_ISDIR(st.st_mode)
            else "other"
        )
        digest = None
        if kind == "file":
            try:
                sha = hashlib.sha256()
                with open(path, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        sha.update(chunk)
                digest = sha.hexdigest()
            except OSError:
                digest = None
        out[path] = {
            "exists": True,
            "kind": kind,
            "mode": "%04o" % _stat.S_IMODE(st.st_mode),
            "uid": st.st_uid,
            "gid": st.st_gid,
            "sha256": digest,
        }
    return out


def read_small(paths: List[str]) -> Dict[str, Optional[str]]:
    """Per path its text (at most READ_LIMIT bytes, UTF-8 with replacement), None when it cannot be read."""
    out: Dict[str, Optional[str]] = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                out[path] = handle.read(READ_LIMIT).decode("utf-8", errors="replace")
        except OSError:
            out[path] = None
    return out


def packages_missing(names: List[str], dpkg_status: str) -> Optional[List[str]]:
    """Which of ``names`` dpkg's status does not mark installed (None: no status file to read)."""
    if not names:
        return []
    try:
        with open(dpkg_status, encoding="utf-8", errors="replace") as handle:
            text: Optional[str] = handle.read()
    except OSError:
        text = None
    return _packages.missing(names, text)


def _entries(option: str, value: str, directory: str) -> Optional[List[os.DirEntry]]:
    """The entries of ``directory`` (None when it does not exist); any other OS error is a refusal
    naming ``option``: a node whose directory cannot be read must not look like one without engines."""
    try:
        with os.scandir(directory) as it:
            return list(it)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UmaError(
            option,
            value,
            "%s cannot be read (%s)" % (directory, err.strerror or err),
            "Make %s a directory root can read (it is missing, or a directory, on a sane node)." % directory,
        ) from err


def _is(entry: os.DirEntry, kind: str) -> bool:
    """Does ``entry`` (followed through symlinks, as systemd and the watchdog do) have this kind?"""
    try:
        return entry.is_dir() if kind == "dir" else entry.is_file()
    except OSError:
        return False


def installed(systemd_dir: str, warnings: List[str]) -> List[str]:
    """Engines with a drop-in directory ``<systemd_dir>/uma-vllm@NAME.service.d`` (sorted).

    A regular file of that name is not a drop-in directory; ``uma-vllm@.service.d`` belongs to the
    template itself; a NAME that is no engine name was not written by the collection (warned, left out).
    """
    names = []
    for entry in _entries("systemd_dir", systemd_dir, systemd_dir) or []:
        if not (entry.name.startswith(UNIT_PREFIX) and entry.name.endswith(DROP_IN_SUFFIX)):
            continue
        name = entry.name[len(UNIT_PREFIX) : -len(DROP_IN_SUFFIX)]
        if not name or not _is(entry, "dir"):
            continue
        if not is_engine_name(name):
            warnings.append(
                "%s is not an engine's drop-in directory (%r is no engine name); left alone" % (entry.path, name)
            )
            continue
        names.append(name)
    return sorted(names)


def watchdogs(config_dir: str, warnings: List[str]) -> Tuple[List[str], List[str]]:
    """Names and paths of the watchdog configs ``<config_dir>/watchdog/NAME.json`` (sorted; none
    when the directory is missing). Hidden files (a writer's temporary file) are not configs."""
    directory = os.path.join(config_dir, WATCHDOG_SUBDIR)
    found = {}
    for entry in _entries("config_dir", config_dir, directory) or []:
        if entry.name.startswith(".") or not entry.name.endswith(".json") or not _is(entry, "file"):
            continue
        name = entry.name[: -len(".json")]
        if not is_engine_name(name):
            warnings.append(
                "%s is not an engine's watchdog config (%r is no engine name); left alone" % (entry.path, name)
            )
            continue
        found[name] = entry.path
    names = sorted(found)
    return names, [found[name] for name in names]


def stamps(stamps_path: str, warnings: List[str]) -> Dict[str, Any]:
    """The stamps file as a dict; ``{}`` when missing. Unreadable, not JSON or not an object: ``{}``
    and a warning - the role then restarts the engines, which is the safe side."""
    try:
        text = read_text(stamps_path)
    except OSError as err:
        warnings.append(
            "%s cannot be read (%s); treating it as empty, so the started engines restart"
            % (stamps_path, err.strerror or err)
        )
        return {}
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except ValueError as err:
        warnings.append(
            "%s is not JSON (%s); treating it as empty, so the started engines restart" % (stamps_path, err)
        )
        return {}
    if not isinstance(data, dict):
        warnings.append(
            "%s holds a JSON %s, not an object; treating it as empty, so the started engines restart"
            % (stamps_path, type(data).__name__)
        )
        return {}
    return data


def units(runner: Runner, systemctl: Optional[str], engines: List[str]) -> Dict[str, Dict[str, str]]:
    """Each engine's unit properties from one ``systemctl show`` (``{}`` and no call for none)."""
    return read_units(runner, systemctl, engines, (UNIT_PREFIX,))[UNIT_PREFIX]


def read_units(
    runner: Runner, systemctl: Optional[str], engines: List[str], prefixes: Tuple[str, ...], extra: Tuple[str, ...] = ()
) -> Dict[str, Dict[str, Dict[str, str]]]:
    """Each engine's unit properties, per unit prefix (the engine's ``uma-vllm@``, its watchdog's
    ``uma-vllm-watchdog@``), from one ``systemctl show`` (``{}`` per prefix and no call for none);
    the units of ``extra`` in the same call, under the key ``""`` (per unit name)."""
    if not engines and not extra:
        return dict({prefix: {} for prefix in prefixes}, **{"": {}})
    if not systemctl:
        raise UmaError(
            "engines" if engines else "extra_units",
            engines or list(extra),
            "needs systemctl on the node to read the units' states, but systemctl was not found in PATH",
            "Run it against a node booted with systemd (DGX OS, Ubuntu, Debian, JetPack), or give engines: [].",
        )
    argv = [systemctl, "show"]
    for prop in SHOW_PROPERTIES:
        argv += ["-p", prop]
    argv += ["%s%s.service" % (prefix, name) for prefix in prefixes for name in engines]
    argv += list(extra)
    try:
        rc, out, err = runner(argv)
    except (OSError, ValueError) as exc:
        raise UmaError(
            "engines", engines, "could not run %s (%s)" % (systemctl, exc), "Check systemctl on the node."
        ) from exc
    if rc != 0 and not (_NOT_FOUND_RE.search(err or "") and "Id=" in (out or "")):
        raise UmaError(
            "engines",
            engines,
            "%s exited %d reading the units' states: %s"
            % (" ".join(argv), rc, (err or out or "").strip() or "no output"),
            "Check systemd on the node ('systemctl is-system-running'); run with become: true.",
        )
    found = {prefix: unit_states(out, engines, prefix) for prefix in prefixes}
    found[""] = {}
    for block in (out or "").split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id") in extra:
            found[""][props["Id"]] = props
    for unit in extra:
        found[""].setdefault(unit, {"ActiveState": "inactive", "UnitFileState": ""})
    return found


def engine_facts(params: Dict[str, Any], runner: Runner, systemctl: Optional[str]) -> Dict[str, Any]:
    """The module's result without ``changed`` (see its RETURN)."""
    request = check_request(params)
    warnings: List[str] = []
    names, paths = watchdogs(request["config_dir"], warnings)
    prefixes = (UNIT_PREFIX, WATCHDOG_PREFIX) if request["watchdog_units"] else (UNIT_PREFIX,)
    found = read_units(runner, systemctl, request["engines"], prefixes, tuple(request["extra_units"]))
    result = {
        "installed": installed(request["systemd_dir"], warnings),
        "watchdogs": names,
        "watchdog_paths": paths,
        "stamps": stamps(request["stamps_path"], warnings),
        "units": found[UNIT_PREFIX],
        "systemd_dir": request["systemd_dir"],
        "config_dir": request["config_dir"],
        "stamps_path": request["stamps_path"],
        "files": file_facts(request["files"]),
        "contents": read_small(request["read"]),
        "extra_units": found[""],
        "packages_missing": packages_missing(request["packages"], request["dpkg_status"]),
    }
    if request["watchdog_units"]:
        result["watchdog_units"] = found[WATCHDOG_PREFIX]
    if warnings:
        result["warnings"] = warnings
    return result
