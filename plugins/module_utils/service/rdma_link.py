# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster link of a multi-node vllm_service engine on this node: RDMA (RoCE) where the node's
``uma.vllm.rdma_facts`` shows a usable device, else TCP sockets (issue 35 item 2).

With RDMA the engine's environment names the HCAs (``NCCL_IB_HCA``: on a DGX Spark both PCIe halves
of the ConnectX-7 port that carries the cluster address) and the RoCE v2 GID index of that address
(``NCCL_IB_GID_INDEX``); the socket interface variables stay as they are (NCCL and gloo bootstrap
over TCP). A container gets the RDMA devices (``--device /dev/infiniband``, the directory, as
eugr/spark-vllm-docker passes it), unlimited locked memory (``--ulimit memlock=-1:-1``) and
``--cap-add IPC_LOCK`` for NCCL's memory registration; the native runtime's unit already has
``LimitMEMLOCK=infinity`` (templates/uma-vllm@.service.j2). Without RDMA nothing is added and the
plan says "TCP sockets" and why.

Every value comes from the facts and can be overridden: the role's ``vllm_service_rdma`` (auto,
true, false), ``vllm_service_rdma_hcas`` and ``vllm_service_rdma_gid_index``, and per engine
``rdma``, ``rdma_hcas`` and ``rdma_gid_index``. A bad value is refused naming the option, the
value and the fix. Every value written into the environment or the ``docker run`` words is checked
here (HCA names ``^[A-Za-z0-9_.-]+$``, the GID index a whole number 0..255), the facts' too.

Pure functions on plain data, controller only; the role reaches them through
plugins/filter/vllm_service.py (``vllm_service_rdma_links``) and service/engines.py (the launcher
config). Tests: tests/unit/plugins/module_utils/test_vllm_service_rdma_link.py.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.service.base import EngineModelError, _err

HCA_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
GID_INDEX_MAX = 255
DEVICES_DIR = "/dev/infiniband"
ROCE_V2 = "RoCE v2"
MODES = ("auto", "true", "false")
_TRUE = ("true", "yes", "on")
_FALSE = ("false", "no", "off")
# the environment the link owns: an engine's env may not set these (rdma_hcas / rdma_gid_index do)
LINK_ENV = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX")

MODE_FIX = (
    "Use auto (RDMA where this node has a usable RDMA device on the cluster link, else TCP sockets), "
    "true (refuse a node without one) or false (TCP sockets)."
)
HCAS_FIX = (
    "Give a list of RDMA device names as /sys/class/infiniband lists them (letters, digits, '.', '_', '-'), "
    "e.g. [rocep1s0f1, roceP2p1s0f1], or null to take them from uma.vllm.rdma_facts."
)
GID_FIX = (
    "Give a whole number from 0 to 255 (the RoCE v2 GID index of the cluster address: uma.vllm.rdma_facts' "
    "cluster.gid_index), or null to read it on every run (it can move after a reboot)."
)


# --------------------------------------------------------------------------
# The overrides


def parse_mode(option: str, value: Any) -> Tuple[Optional[str], Optional[str]]:
    """(auto | true | false, None) or (None, the refusal). None and '' are auto."""
    if value is None or value == "":
        return "auto", None
    if isinstance(value, bool):
        return ("true" if value else "false"), None
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text == "auto":
        return "auto", None
    if text in _TRUE:
        return "true", None
    if text in _FALSE:
        return "false", None
    return None, _err(option, value, "is not auto, true or false", MODE_FIX)


def parse_hcas(option: str, value: Any) -> Tuple[Optional[List[str]], Optional[str]]:
    """(the HCA names, None) or (None, the refusal); None, '' and [] are "from the facts" (None, None).
    A string is taken as NCCL_IB_HCA writes it, names separated by commas."""
    if value is None or value in ("", []):
        return None, None
    if isinstance(value, str):
        names: Any = [word.strip() for word in value.split(",")]
    elif isinstance(value, list):
        names = value
    else:
        return None, _err(option, value, "is not a list of RDMA device names", HCAS_FIX)
    for name in names:
        if not isinstance(name, str) or not HCA_RE.match(name):
            return None, _err(option, value, "has %r, which is not an RDMA device name" % (name,), HCAS_FIX)
    if len(set(names)) != len(names):
        return None, _err(option, value, "names a device twice", "Name each RDMA device once.")
    return list(names), None


def parse_gid_index(option: str, value: Any) -> Tuple[Optional[int], Optional[str]]:
    """(the index, None) or (None, the refusal); None and '' are "from the facts" (None, None)."""
    if value is None or value == "":
        return None, None
    number: Optional[int] = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.match(r"^[0-9]{1,3}$", value.strip()):
        number = int(value.strip())
    if number is None or not 0 <= number <= GID_INDEX_MAX:
        return None, _err(option, value, "is not a GID index (a whole number from 0 to 255)", GID_FIX)
    return number, None


def _overrides(engine: Dict[str, Any], rdma: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """The mode, HCAs and GID index that apply to ``engine`` (its own keys first, then the role's),
    each with the option it came from, and the refusals."""
    where = "vllm_service_engines[%s]" % engine.get("name")
    out: Dict[str, Any] = {}
    errors: List[str] = []
    for key, parse, role_option in (
        ("mode", parse_mode, "vllm_service_rdma"),
        ("hcas", parse_hcas, "vllm_service_rdma_hcas"),
        ("gid_index", parse_gid_index, "vllm_service_rdma_gid_index"),
    ):
        engine_key = "rdma" if key == "mode" else "rdma_" + key
        own = engine.get(engine_key)
        if own is not None and own != "":
            option, raw = "%s.%s" % (where, engine_key), own
        else:
            option, raw = role_option, rdma.get(key)
        value, error = parse(option, raw)
        if error:
            errors.append(error)
        out[key] = (value, option)
    return out, errors


def settings_errors(engines: Any, rdma: Dict[str, Any]) -> List[str]:
    """Every problem of the RDMA overrides of this host's engines (the role's and each engine's),
    before anything is read from the node; an engine's env that sets what the link owns too."""
    errors: List[str] = []
    for engine in engines or []:
        if not isinstance(engine, dict) or engine.get("state") == "absent":
            continue
        _values, wrong = _overrides(engine, rdma or {})
        errors.extend(error for error in wrong if error not in errors)
        if engine.get("cluster"):
            for key in LINK_ENV:
                if key in (engine.get("env") or {}):
                    errors.append(
                        _err("vllm_service_engines[%s].env.%s" % (engine.get("name"), key), engine["env"][key],
                             "is set by the role from uma.vllm.rdma_facts on a multi-node engine",
                             "Drop it from env; give the engine rdma_hcas / rdma_gid_index (or the role's "
                             "vllm_service_rdma_hcas / vllm_service_rdma_gid_index) to override what the node shows.")
                    )  # fmt: skip
    for key, parse, option in (
        ("mode", parse_mode, "vllm_service_rdma"),
        ("hcas", parse_hcas, "vllm_service_rdma_hcas"),
        ("gid_index", parse_gid_index, "vllm_service_rdma_gid_index"),
    ):
        error = parse(option, (rdma or {}).get(key))[1]
        if error and error not in errors:
            errors.append(error)
    return errors


# --------------------------------------------------------------------------
# What the node has


def _ports_by_device(facts: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    out: Dict[str, List[Dict[str, Any]]] = {}
    for device in facts.get("devices") or []:
        if isinstance(device, dict) and isinstance(device.get("name"), str):
            out[device["name"]] = [p for p in device.get("ports") or [] if isinstance(p, dict)]
    return out


def _port_text(name: str, port: Dict[str, Any]) -> str:
    return "%s port %s is %s, not ACTIVE" % (name, port.get("port"), port.get("state") or "in an unknown state")


def _down_reason(name: str, ports: List[Dict[str, Any]]) -> Optional[str]:
    """Why ``name`` cannot carry RDMA: no ACTIVE port (None when one is)."""
    if any(p.get("active") is True for p in ports):
        return None
    if not ports:
        return "%s has no ports in sysfs" % name
    return "; ".join(_port_text(name, p) for p in ports)


def _gid_reason(name: str, ports: List[Dict[str, Any]], index: int) -> Optional[str]:
    """Why ``name`` cannot use GID index ``index`` (NCCL_IB_GID_INDEX is one index for every HCA):
    none of its ACTIVE ports has a RoCE v2 GID there (None when one has)."""
    seen = []
    for port in ports:
        if port.get("active") is not True:
            continue
        for gid in port.get("gids") or []:
            if not isinstance(gid, dict) or gid.get("type") != ROCE_V2:
                continue
            if gid.get("index") == index:
                return None
            seen.append(str(gid.get("index")))
    return (
        "%s has no RoCE v2 GID at index %d (its RoCE v2 GIDs: %s), and NCCL_IB_GID_INDEX is one index for every HCA"
        % (name, index, ", ".join(seen) or "none")
    )


def _candidates(cluster: Dict[str, Any]) -> List[str]:
    """The devices of the cluster link as rdma_facts sees it: the one that carries the address, the
    others on its subnet (when the subnet is known), the other PCIe half of its port; each once."""
    names: List[str] = []
    entries = [{"device": cluster.get("device")}] if cluster.get("device") else []
    if cluster.get("subnet"):
        entries += [e for e in cluster.get("devices") or [] if isinstance(e, dict)]
    entries += [e for e in cluster.get("twins") or [] if isinstance(e, dict)]
    for entry in entries:
        name = entry.get("device")
        if isinstance(name, str) and name not in names:
            names.append(name)
    return names


# --------------------------------------------------------------------------
# The link


def _memlock_value(options: List[str]) -> Optional[str]:
    """The memlock limit the role's container options set (``--ulimit memlock=X`` or ``--ulimit=memlock=X``)."""
    found = None
    for index, word in enumerate(options):
        value = None
        if word == "--ulimit" and index + 1 < len(options):
            value = options[index + 1]
        elif word.startswith("--ulimit="):
            value = word[len("--ulimit=") :]
        if value and value.startswith("memlock="):
            found = value[len("memlock=") :]
    return found


def _has_option(options: List[str], flag: str, values: Tuple[str, ...]) -> bool:
    for index, word in enumerate(options):
        if word == "--privileged":
            return True
        value = None
        if word == flag and index + 1 < len(options):
            value = options[index + 1]
        elif word.startswith(flag + "="):
            value = word[len(flag) + 1 :]
        if value is not None and (value.split(":", 1)[0] in values or value.upper() in values):
            return True
    return False


def container_words(options: Any, name: str) -> List[str]:
    """The ``docker/podman run`` words an RDMA engine needs, less what the role's container options
    already give (they come after these words, so a finite memlock there would win: refused)."""
    options = [str(word) for word in options or []]
    words: List[str] = []
    if not _has_option(options, "--device", (DEVICES_DIR,)):
        words += ["--device", DEVICES_DIR]
    memlock = _memlock_value(options)
    if memlock is None:
        words += ["--ulimit", "memlock=-1:-1"]
    elif memlock not in ("-1", "-1:-1"):
        raise EngineModelError(
            _err("vllm_service_container_options", options,
                 "limit locked memory to %s while engine %s uses RDMA (NCCL registers its buffers with the HCA "
                 "and needs unlimited locked memory)" % (memlock, name),
                 "Use --ulimit memlock=-1:-1 (or leave memlock out: the role adds it), or set "
                 "vllm_service_rdma: false.")
        )  # fmt: skip
    if not _has_option(options, "--cap-add", ("IPC_LOCK", "CAP_IPC_LOCK", "ALL")):
        words += ["--cap-add", "IPC_LOCK"]
    return words


def _tcp(reason: str, ifname: Any) -> Dict[str, Any]:
    bootstrap = " over %s" % ifname if ifname else ""
    return {
        "transport": "tcp",
        "reason": reason,
        "hcas": [],
        "gid_index": None,
        "env": {},
        "container_options": [],
        "unused": [],
        "notes": [],
        "text": "cluster link: TCP sockets%s (%s)" % (bootstrap, reason),
    }


def _refuse_or_tcp(mode: Tuple[Optional[str], str], name: str, reason: str, fix: str, ifname: Any) -> Dict[str, Any]:
    if mode[0] == "true":
        raise EngineModelError(
            _err(mode[1], True, "but engine %s cannot use RDMA on this node: %s" % (name, reason),
                 fix + " Or set %s: auto (TCP sockets where there is no RDMA)." % mode[1])
        )  # fmt: skip
    return _tcp(reason, ifname)


def link(engine: Dict[str, Any], rdma: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The cluster link of ``engine`` on this node; None for a single-node engine.

    ``rdma``: the role's ``mode``, ``hcas`` and ``gid_index`` overrides, ``facts`` (uma.vllm.rdma_facts'
    ``uma_rdma``, None when not read), ``ifname`` (NCCL_SOCKET_IFNAME, for the text), ``runtime`` and
    ``container_options`` (the role's). Returns ``transport`` (rdma or tcp), ``reason``, ``hcas``,
    ``gid_index``, ``env``, ``container_options`` (the words to add), ``unused`` (devices of the link
    not used, each with why), ``notes`` and ``text`` (the plan's lines)."""
    if not engine.get("cluster"):
        return None
    rdma = rdma or {}
    name = str(engine.get("name"))
    values, errors = _overrides(engine, rdma)
    if errors:
        raise EngineModelError(" | ".join(errors))
    mode, (hcas, hcas_option), (gid_index, gid_option) = values["mode"], values["hcas"], values["gid_index"]
    ifname = rdma.get("ifname")
    if mode[0] == "false":
        return _tcp("RDMA turned off by %s: false" % mode[1], ifname)
    facts = rdma.get("facts")
    if not isinstance(facts, dict):
        return _refuse_or_tcp(mode, name, "this node's RDMA devices were not read (uma.vllm.rdma_facts)",
                              "Run the role as it is (it reads them for every multi-node engine).", ifname)  # fmt: skip
    ports = _ports_by_device(facts)
    if not facts.get("present") or not ports:
        return _refuse_or_tcp(mode, name, "no RDMA devices on this node",
                              "Give the node an RDMA device on the cluster link (the ConnectX-7 port of a DGX Spark).",
                              ifname)  # fmt: skip
    cluster = facts.get("cluster") if isinstance(facts.get("cluster"), dict) else {}
    unused: List[str] = []
    notes: List[str] = []
    # the GID index: the override, else the RoCE v2 GID of the cluster address
    if gid_index is not None:
        gid_source = gid_option
    else:
        if not cluster.get("found"):
            reason = cluster.get("message") or "the cluster address was not given to uma.vllm.rdma_facts (not IPv4)"
            return _refuse_or_tcp(mode, name, "no RoCE v2 GID index for the cluster address: %s" % reason,
                                  "Put the cluster address on the RDMA netdev of the link, or give "
                                  "vllm_service_rdma_gid_index.", ifname)  # fmt: skip
        gid_index, error = parse_gid_index("uma_rdma.cluster.gid_index", cluster.get("gid_index"))
        if error:
            return _refuse_or_tcp(mode, name, error, "Give vllm_service_rdma_gid_index.", ifname)
        gid_source = "rdma_facts: %s" % cluster.get("message") if cluster.get("message") else "rdma_facts"
    # the HCAs: the override (each a device of this node), else the link's devices that can carry RDMA
    if hcas is not None:
        hca_source = hcas_option
        missing = [h for h in hcas if h not in ports]
        if missing:
            raise EngineModelError(
                _err(hcas_option, hcas, "names %s, not an RDMA device of this node (it has %s)"
                     % (", ".join(missing), ", ".join(sorted(ports))),
                     "Name devices of /sys/class/infiniband on this node, or leave it null to take them from "
                     "uma.vllm.rdma_facts.")
            )  # fmt: skip
        for hca in hcas:
            down = _down_reason(hca, ports[hca])
            if down:
                notes.append("%s (named by %s; NCCL skips a port that is not ACTIVE)" % (down, hcas_option))
            elif _gid_reason(hca, ports[hca], gid_index):
                notes.append("%s (named by %s)" % (_gid_reason(hca, ports[hca], gid_index), hcas_option))
        chosen = list(hcas)
    else:
        hca_source = "rdma_facts"
        chosen = []
        for device in _candidates(cluster):
            why = None
            if not HCA_RE.match(device):
                why = "%r is not a name NCCL_IB_HCA can carry" % device
            elif device not in ports:
                why = "%s is not among the node's RDMA devices" % device
            else:
                why = _down_reason(device, ports[device]) or _gid_reason(device, ports[device], gid_index)
            if why:
                unused.append("%s: not used, %s" % (device, why))
            else:
                chosen.append(device)
        if not chosen:
            reason = "no RDMA device of the cluster link is usable"
            if unused:
                reason += " (%s)" % "; ".join(unused)
            elif not cluster.get("found") and cluster.get("message"):
                reason += " (%s)" % cluster["message"]
            return _refuse_or_tcp(mode, name, reason,
                                  "Bring the cluster link's port up (ibdev2netdev shows it Up), or name the devices "
                                  "in vllm_service_rdma_hcas.", ifname)  # fmt: skip
    runtime = engine.get("runtime") or rdma.get("runtime") or "container"
    words = container_words(rdma.get("container_options"), name) if runtime == "container" else []
    env = {"NCCL_IB_HCA": ",".join(chosen), "NCCL_IB_GID_INDEX": str(gid_index)}
    lines = [
        "cluster link: RDMA (RoCE v2), NCCL_IB_HCA=%s (%s), NCCL_IB_GID_INDEX=%d (%s)"
        % (env["NCCL_IB_HCA"], hca_source, gid_index, gid_source),
        "  bootstrap: TCP sockets%s (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME as before)"
        % (" over %s" % ifname if ifname else ""),
    ]
    if runtime == "container":
        options = [str(word) for word in rdma.get("container_options") or []]
        given = []
        if "--device" not in words:
            given.append("the RDMA devices")
        if "--ulimit" not in words:
            given.append("memlock=%s" % _memlock_value(options))
        if "--cap-add" not in words:
            given.append("IPC_LOCK")
        text = " ".join(words)
        if given:
            text += "%s(%s from vllm_service_container_options)" % (" " if text else "", ", ".join(given))
        lines.append("  container: %s" % text)
    else:
        lines.append("  unit: LimitMEMLOCK=infinity (uma-vllm@.service)")
    lines += ["  %s" % line for line in unused + notes]
    return {
        "transport": "rdma",
        "reason": None,
        "hcas": chosen,
        "gid_index": gid_index,
        "env": env,
        "container_options": words,
        "unused": unused,
        "notes": notes,
        "text": "\n".join(lines),
    }


_WORDS = ("--device", DEVICES_DIR, "--ulimit", "memlock=-1:-1", "--cap-add", "IPC_LOCK")


def checked(name: Any, found: Any) -> Dict[str, Any]:
    """A link as ``link`` gave it, checked again where its values are written (the launcher config's
    env, the ``docker run`` words): only NCCL_IB_HCA (device names) and NCCL_IB_GID_INDEX (0..255),
    only the words ``container_words`` gives."""
    problem = None
    env = found.get("env") if isinstance(found, dict) else None
    words = found.get("container_options") if isinstance(found, dict) else None
    if not isinstance(env, dict) or not isinstance(words, list):
        problem = "is not a cluster link (env and container_options)"
    elif set(env) - set(LINK_ENV):
        problem = "sets %s, not only %s" % (sorted(set(env) - set(LINK_ENV)), ", ".join(LINK_ENV))
    elif "NCCL_IB_HCA" in env and not all(HCA_RE.match(h) for h in str(env["NCCL_IB_HCA"]).split(",")):
        problem = "has NCCL_IB_HCA %r, not RDMA device names" % (env["NCCL_IB_HCA"],)
    elif "NCCL_IB_GID_INDEX" in env and parse_gid_index("NCCL_IB_GID_INDEX", env["NCCL_IB_GID_INDEX"])[1]:
        problem = "has NCCL_IB_GID_INDEX %r, not a whole number from 0 to 255" % (env["NCCL_IB_GID_INDEX"],)
    elif not all(isinstance(w, str) and w in _WORDS for w in words):
        problem = "has container words %r, not only %s" % (words, " ".join(_WORDS))
    if problem:
        raise EngineModelError(
            _err("links[%s]" % name, found, problem, "Pass what the filter vllm_service_rdma_links returns.")
        )
    return found


def links(engines: Any, rdma: Optional[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """``link`` of every multi-node engine of this host that is not absent, by engine name."""
    out: Dict[str, Dict[str, Any]] = {}
    for engine in engines or []:
        if isinstance(engine, dict) and engine.get("state") != "absent":
            found = link(engine, rdma)
            if found is not None:
                out[str(engine.get("name"))] = found
    return out
