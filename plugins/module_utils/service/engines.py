# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine model of the uma.vllm.vllm_service role, in one place: which engines a host
runs, what is wrong with their definitions (and with the role's scalar settings), the engine
user, and the launcher config of each engine (native or container runtime, single node,
multi-node mp ranks or a Ray cluster) with its systemd drop-in.

Pure functions on plain data, run on the controller only. The role reaches them through the
thin filters of plugins/filter/vllm_service.py; what the role finds on the node (fingerprints,
restarts, unit states) is in service/state.py, each engine's watchdog config in
service/watchdog.py, the container runtime's ``docker/podman run`` words in
service/container.py and the shared refusal type and constants in service/base.py
(both re-exported here). Tests: tests/unit/plugins/module_utils/test_vllm_service_model.py
and tests/unit/plugins/filter/test_vllm_service.py.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.checks import SECRET_ENV_RE, SECRET_FLAGS
from ansible_collections.uma.vllm.plugins.module_utils.node.cluster.ranks import strip_flags
from ansible_collections.uma.vllm.plugins.module_utils.service import rdma_link, version
from ansible_collections.uma.vllm.plugins.module_utils.service.base import (
    COPY_PORT_OFFSET,
    DEFAULT_MASTER_PORT,
    DEFAULT_RAY_PORT,
    ENV_RE,
    LINK_PORT_OFFSET,
    MULTINODE_BARE,
    MULTINODE_WITH_VALUE,
    NAME_RE,
    SOURCE_SECRETS,
    STATUS_PORT_OFFSET,
    WILDCARD_HOSTS,
    EngineModelError,
    _err,
    api_url,
    node_ports,
)
from ansible_collections.uma.vllm.plugins.module_utils.service.container import (
    _container_command,
    container_name,
    container_prefix,
    container_secrets_file,
)
from ansible_collections.uma.vllm.plugins.module_utils.service.files import link_key_dir_errors, link_key_file

# --------------------------------------------------------------------------
# The role's scalar settings and the engine user

GIB_RE = re.compile(r"^[0-9]+(\.[0-9]+)?$")
BOOL_WORDS = ("true", "false", "yes", "no")


def _json(value: Any) -> str:
    return json.dumps(value)


def engine_user(user: Any) -> Optional[Any]:
    """The engine user for least privilege: None when the engines run as root."""
    return None if user in (None, "", "root") else user


def user_keys(user: Any, group: Any, groups: Any, home: Any) -> Dict[str, Any]:
    """What the launcher needs to drop to the engine user (each engine's config)."""
    user = engine_user(user)
    return {
        "user": user,
        "group": group if user else None,
        "groups": groups if user else None,
        "home": home if user else None,
    }


def hardening(base: Dict[str, Any], user_extra: Dict[str, Any], user: Any) -> Dict[str, Any]:
    """The unit's hardening, plus what a non-root engine user allows on top."""
    out = dict(base)
    if engine_user(user):
        out.update(user_extra)
    return out


def settings_errors(
    ram_gib: Any, reserve_gib: Any, unified_memory: Any, user: Any, engines: List[Dict[str, Any]], runtime: Any
) -> List[str]:
    """Problems of the role's scalar settings, each naming the variable, its value and the fix."""
    errors = []
    if not (ram_gib in (None, "") or (GIB_RE.match(str(ram_gib)) and float(ram_gib) > 0)):
        errors.append(
            "vllm_service_ram_gib = %s is not a positive number of GiB. Fix: set uma_ram_gib in host_vars to the"
            " RAM the host shows (e.g. 121 on a 128 GB DGX Spark)." % _json(ram_gib)
        )
    if not (reserve_gib in (None, "") or GIB_RE.match(str(reserve_gib))):
        errors.append(
            "vllm_service_reserve_gib = %s is not a number of GiB >= 0. Fix: set uma_reserve_gib (e.g. 12)."
            % _json(reserve_gib)
        )
    if str(unified_memory).lower() not in BOOL_WORDS:
        errors.append(
            "vllm_service_unified_memory = %s is not a boolean. Fix: true on DGX Spark/GH200/Jetson Thor."
            % _json(unified_memory)
        )
    runtimes = [engine.get("runtime") or runtime for engine in engines or []]
    if engine_user(user) and "container" in runtimes:
        errors.append(
            "vllm_service_user = %s needs the native runtime: the container runtime's client drives the root"
            " docker daemon, which is root-equivalent. Fix: set vllm_service_runtime: native (and the engines'"
            " runtime), or leave vllm_service_user root." % _json(user)
        )
    return errors


# --------------------------------------------------------------------------
# The engines of a host


def host_engines(engines: Any, hostname: str, default_backend: str = "mp") -> List[Dict[str, Any]]:
    """The engines this host runs, in the given order, with their rank when they span nodes.

    An engine without ``nodes`` runs on every host that has it in its vars; an engine with
    ``nodes`` runs on those hosts only, rank = position in the list (rank 0 serves the API).
    """
    if not isinstance(engines, list):
        raise EngineModelError(
            _err("vllm_service_engines", engines, "is not a list", "Give a list of engine mappings.")
        )
    out = []
    for index, raw in enumerate(engines):
        if not isinstance(raw, dict):
            raise EngineModelError(
                _err("vllm_service_engines[%d]" % index, raw, "is not a mapping", "Give name, port, model_path ...")
            )
        engine = dict(raw)
        nodes = engine.get("nodes") or []
        if nodes and hostname not in nodes:
            continue
        engine["state"] = engine.get("state") or "started"
        if isinstance(engine.get("port"), str) and engine["port"].isdigit():
            engine["port"] = int(engine["port"])
        engine["env"] = dict(engine.get("env") or {})
        # Only the names of secrets travel in facts and loop items; their values stay in
        # vllm_service_engines and reach the node only through the no_log EnvironmentFile task.
        secrets = engine.pop("secrets", None) or {}
        engine["secret_keys"] = list(secrets) if isinstance(secrets, dict) else ["<not a mapping>"]
        engine["secret_names"] = (
            sorted(str(k) for k, v in secrets.items() if v is not None and str(v) != "")
            if isinstance(secrets, dict) else []
        )  # fmt: skip
        engine["plan"] = dict(engine.get("plan") or {})
        engine["cluster"] = None
        engine["api_rank"] = True
        if len(nodes) > 1:
            engine["cluster"] = {
                "nodes": list(nodes),
                "nnodes": len(nodes),
                "rank": list(nodes).index(hostname),
                "head": nodes[0],
                "backend": engine.get("backend") or default_backend or "mp",
                "master_port": int(engine.get("master_port") or DEFAULT_MASTER_PORT),
                "ray_port": int(engine.get("ray_port") or DEFAULT_RAY_PORT),
            }
            engine["cluster"]["link_port"] = int(
                engine.get("link_port") or engine["cluster"]["master_port"] + LINK_PORT_OFFSET
            )
            engine["api_rank"] = engine["cluster"]["rank"] == 0
        out.append(engine)
    return out


def secrets(engines: Any, name: str, hostname: str) -> Dict[str, str]:
    """The non-empty secrets of this host's engine ``name`` (for the no_log EnvironmentFile task)."""
    for engine in engines or []:
        if not isinstance(engine, dict) or engine.get("name") != name:
            continue
        nodes = engine.get("nodes") or []
        if nodes and hostname not in nodes:
            continue
        found = engine.get("secrets") or {}
        return {str(k): str(v) for k, v in found.items() if v is not None and str(v) != ""}
    return {}


def check(
    engines: List[Dict[str, Any]], settings: Dict[str, Any], known_hosts: Any, addrs: Dict[str, Any]
) -> List[str]:
    """Every problem of this host's engine definitions, each naming option, value and fix."""
    errors: List[str] = []
    seen_names: Dict[str, int] = {}
    seen_ports: Dict[int, str] = {}
    known = set(known_hosts or [])
    timeout = settings.get("health_timeout_s")
    if timeout not in (None, "") and not (GIB_RE.match(str(timeout)) and float(timeout) > 0):
        errors.append(
            _err("vllm_service_health_timeout_s", timeout, "is not a positive number of seconds",
                 "Give how long an engine may take to become healthy, e.g. 1800.")
        )  # fmt: skip
    if "link_key_dir" in settings:
        errors.extend(link_key_dir_errors(settings["link_key_dir"], engines))
    if "rdma" in settings:
        # the RDMA overrides' form, before rdma_facts reads the node (service/rdma_link.py)
        errors.extend(rdma_link.settings_errors(engines, settings["rdma"]))
    for index, engine in enumerate(engines):
        where = "vllm_service_engines[%s]" % (engine.get("name") or index)
        errors.extend(_check_name(where, engine, index, seen_names))
        if engine.get("state") == "absent":
            continue
        errors.extend(_check_port(where, engine, seen_ports))
        errors.extend(_check_paths_and_env(where, engine))
        errors.extend(_check_runtime(where, engine, settings))
        errors.extend(_check_secrets(where, engine))
        errors.extend(_check_api_auth(where, engine, settings))
        nodes = engine.get("nodes") or []
        if nodes:
            errors.extend(_check_nodes(where, engine, nodes, known, addrs, settings))
    errors.extend(shared_port_errors([e for e in engines if isinstance(e, dict) and e.get("state") != "absent"]))
    return errors


def shared_port_errors(engines: List[Dict[str, Any]]) -> List[str]:
    """Issue 34 item 4: two engines on this node never listen on one port. Their API ports are
    checked by _check_port; here every other port (base.node_ports), each collision named with both
    engines and a free value. Two multi-node engines on one pair with the default master_port
    (29501) collide on all of master_port + 0, 10, 11 and 12: one message per engine key."""
    claims = [(engine, node_ports(engine)) for engine in engines]
    taken = {port for _engine, ports in claims for port in ports}
    owner: Dict[int, Tuple[str, str, str]] = {}
    errors: List[str] = []
    said = set()
    for engine, ports in claims:
        name = str(engine.get("name"))
        for port, (key, what) in sorted(ports.items()):
            if port not in owner:
                owner[port] = (name, key, what)
                continue
            other, other_key, other_what = owner[port]
            if other == name or (key == "port" and other_key == "port") or (name, key) in said:
                continue
            said.add((name, key))
            value = _key_value(engine, key, port)
            free = _free_port(key, value if isinstance(value, int) else port, taken)
            errors.append(
                _err("vllm_service_engines[%s].%s" % (name, key), value,
                     "puts its %s on port %d of this host, where engine %s's %s listens"
                     % (what, port, other, other_what),
                     "Give engine %s its own %s, e.g. %d%s." % (name, key, free, _FOLLOW.get(key, "")))
            )  # fmt: skip
    return errors


_FOLLOW = {
    "master_port": " (its rank link, watchdog status and model copy follow at +%d, +%d, +%d)"
    % (LINK_PORT_OFFSET, STATUS_PORT_OFFSET, COPY_PORT_OFFSET),
}


def _key_value(engine: Dict[str, Any], key: str, port: int) -> Any:
    cluster = engine.get("cluster") or {}
    return engine.get(key) or cluster.get(key) or port


def _free_port(key: str, port: int, taken: set) -> int:
    """A value for ``key`` that claims no taken port: master_port moves in steps of 100 (its derived
    ports with it), any other key to the next free port."""
    step, span = (
        (100, (0, LINK_PORT_OFFSET, STATUS_PORT_OFFSET, COPY_PORT_OFFSET)) if key == "master_port" else (1, (0,))
    )
    candidate = port + step
    while candidate + max(span) <= 65535:
        if not any(candidate + offset in taken for offset in span):
            return candidate
        candidate += step
    return port


def _check_name(where: str, engine: Dict[str, Any], index: int, seen_names: Dict[str, int]) -> List[str]:
    name = engine.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        return [
            _err(where + ".name", name, "is not a valid engine name",
                 "Use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit.")
        ]  # fmt: skip
    if name in seen_names:
        return [_err(where + ".name", name, "is defined twice for this host", "Give each engine its own name.")]
    seen_names[name] = index
    return []


def _check_port(where: str, engine: Dict[str, Any], seen_ports: Dict[int, str]) -> List[str]:
    port = engine.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return [_err(where + ".port", port, "is not a TCP port", "Use a number from 1 to 65535.")]
    if port in seen_ports:
        return [
            _err(where + ".port", port, "is already the port of engine %s on this host" % seen_ports[port],
                 "Give every engine on a node its own port.")
        ]  # fmt: skip
    seen_ports[port] = engine.get("name")
    return []


def _check_paths_and_env(where: str, engine: Dict[str, Any]) -> List[str]:
    errors = []
    model_path = engine.get("model_path")  # with model (a Hub id): service/hub.py checks both
    if engine.get("model") is None and (not isinstance(model_path, str) or not model_path.startswith("/")):
        errors.append(
            _err(where + ".model_path", model_path, "is not an absolute path",
                 "Give the model directory on the node (e.g. /models/Qwen3-32B), or model: a Hub id.")
        )  # fmt: skip
    for kind, keys in (("env", list(engine.get("env") or {})), ("secrets", engine.get("secret_keys") or [])):
        for key in keys:
            if not isinstance(key, str) or not ENV_RE.match(key):
                errors.append(
                    _err(where + "." + kind, key, "is not an environment variable name",
                         "Use letters, digits and '_', not starting with a digit.")
                )  # fmt: skip
    overlap = sorted(set(engine.get("env") or {}) & set(engine.get("secret_keys") or []))
    if overlap:
        errors.append(
            _err(where + ".secrets", overlap, "are also in env",
                 "Keep secrets in secrets only (they go to the 0600 EnvironmentFile).")
        )  # fmt: skip
    return errors


def _check_runtime(where: str, engine: Dict[str, Any], settings: Dict[str, Any]) -> List[str]:
    errors = []
    runtime = engine.get("runtime") or settings.get("runtime")
    if runtime not in ("container", "native"):
        errors.append(_err(where + ".runtime", runtime, "is not container or native", "Use container or native."))
    if runtime == "container":
        image_where = where + ".image" if engine.get("image") else "vllm_service_image"
        errors += version.reference_errors(image_where, engine.get("image") or settings.get("image"))
    if runtime == "container" and not (engine.get("image") or settings.get("image")):
        errors.append(
            _err(where + ".image", engine.get("image"), "is empty while the runtime is container",
                 "Set vllm_service_image (e.g. nvcr.io/nvidia/vllm:<tag>) or the engine's image.")
        )  # fmt: skip
    options = [str(word) for word in settings.get("container_options") or []]
    if (
        runtime == "container"
        and settings.get("container_engine") == "podman"
        and any(word.startswith("--shm-size") for word in options)
    ):  # podman: "cannot set shmsize when running in the host IPC Namespace" (found live)
        errors.append(
            _err("vllm_service_container_options", options, "sets --shm-size, which podman refuses with --ipc host",
                 "Leave --shm-size out: the role runs every container with --ipc host (the host's /dev/shm).")
        )  # fmt: skip
    command = engine.get("command")
    if command is not None and (not isinstance(command, list) or not all(isinstance(w, str) and w for w in command)):
        errors.append(_err(where + ".command", command, "is not a list of words", "Give e.g. [vllm, serve]."))
    if runtime == "native" and command is None and not settings.get("native_command"):
        errors.append(
            _err("vllm_service_native_command", settings.get("native_command"), "is empty",
                 "Give the engine command before the model, e.g. [/opt/vllm/bin/vllm, serve].")
        )  # fmt: skip
    return errors


def _check_secrets(where: str, engine: Dict[str, Any]) -> List[str]:
    errors = []
    names = engine.get("secret_names") or []
    for key in engine.get("secret_keys") or []:
        if key != "<not a mapping>" and key not in names:
            # an unset environment variable or Vault entry becomes "": never dropped silently (issue 21)
            errors.append(
                "%s.secrets.%s is empty (an unset environment variable or Vault variable gives ''). Fix: give"
                ' it a value, e.g. from Ansible Vault (%s: "{{ vault_%s }}" with vault_%s in an encrypted'
                " vars file), or remove the key." % (where, key, key, str(key).lower(), str(key).lower())
            )
    for key in engine.get("env") or {}:
        if isinstance(key, str) and SECRET_ENV_RE.search(key) and key not in (engine.get("secret_keys") or []):
            errors.append(
                "%s.env: %s looks like a secret; env values go to the engine's 0644 config and launch record."
                " Fix: move it to %s.secrets (only the 0600 EnvironmentFile gets those)." % (where, key, where)
            )
    words = list((engine.get("plan") or {}).get("extra_args") or []) + list(engine.get("command") or [])
    for word in words:
        flag = str(word).split("=", 1)[0]
        flag = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
        if flag in SECRET_FLAGS:
            errors.append(
                "%s: %s puts a secret on the command line (ps, journal, 0644 config). Fix: drop it and set"
                " %s.secrets.%s; vLLM reads it from the environment." % (where, flag, where, SECRET_FLAGS[flag])
            )
    return errors


API_AUTH = ("key", "none")
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(host: Any) -> bool:
    """True when ``host`` is an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    text = str(host or "").strip().strip("[]")
    if text.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _check_api_auth(where: str, engine: Dict[str, Any], settings: Dict[str, Any]) -> List[str]:
    """An API that listens beyond loopback needs VLLM_API_KEY unless the operator said api_auth: none."""
    own = engine.get("api_auth")
    auth = own if own is not None else settings.get("api_auth", "key")
    if auth not in API_AUTH:
        option = where + ".api_auth" if own is not None else "vllm_service_api_auth"
        return [
            _err(
                option,
                auth,
                "is not key or none",
                "Use key (an API beyond loopback needs secrets.VLLM_API_KEY) or none (serve without a key).",
            )
        ]
    host = engine.get("host") or settings.get("api_host") or "127.0.0.1"
    if auth == "none" or is_loopback(host) or "VLLM_API_KEY" in (engine.get("secret_names") or []):
        return []
    if "VLLM_API_KEY" in (engine.get("secret_keys") or []):
        return []  # empty: _check_secrets names it
    option = where + ".host" if engine.get("host") else "vllm_service_api_host"
    return [
        _err(option, host, "lets engine %s's API (port %s) be reached from other machines without a key"
             % (engine.get("name"), engine.get("port")),
             "Set %s.secrets.VLLM_API_KEY (from Ansible Vault, e.g. \"{{ vault_vllm_api_key }}\"), or listen on"
             " 127.0.0.1 only, or say api_auth: none for this engine (or vllm_service_api_auth: none) to serve"
             " without authentication on purpose." % where)
    ]  # fmt: skip


def _check_cluster_addrs(
    engine: Dict[str, Any], head: Any, addrs: Dict[str, Any], settings: Dict[str, Any]
) -> List[str]:
    """This rank's own cluster address (rank 0's is the head's, checked above) and both are IP addresses:
    they go into VLLM_HOST_IP, --master-addr and Ray's --node-ip-address."""
    errors = []
    cluster = engine.get("cluster") or {}
    me = (cluster.get("nodes") or [None])[cluster.get("rank") or 0]
    own = settings.get("node_addr")
    if cluster.get("rank") and own in (None, ""):
        errors.append(
            _err("uma_cluster_addr", own, "is not set for host %s, rank %s of engine %s (no fallback to the"
                 " default-route address: on a Spark that is the management network)"
                 % (me, cluster.get("rank"), engine.get("name")),
                 "Set uma_cluster_addr in host_vars/%s.yml to its address on the cluster link (the ConnectX"
                 " port that ibdev2netdev shows Up: ip -br addr show <interface>)." % me)
        )  # fmt: skip
    for host, value in sorted({me: own, head: addrs.get(head)}.items(), key=str):
        if value in (None, ""):
            continue
        try:
            ipaddress.ip_address(str(value))
        except ValueError:
            errors.append(
                _err("uma_cluster_addr", value, "of host %s is not an IP address" % host,
                     "Give the node's IPv4/IPv6 address on the cluster link (e.g. 192.168.100.11), not a name.")
            )  # fmt: skip
    return errors


def _check_nodes(
    where: str, engine: Dict[str, Any], nodes: Any, known: set, addrs: Dict[str, Any], settings: Dict[str, Any]
) -> List[str]:
    errors = []
    if not isinstance(nodes, list) or len(nodes) < 2:
        return [
            _err(where + ".nodes", nodes, "must list at least two hosts",
                 "Drop nodes for a single-node engine, or list the hosts in rank order.")
        ]  # fmt: skip
    if len(set(nodes)) != len(nodes):
        errors.append(_err(where + ".nodes", nodes, "lists a host twice", "List each host once, rank 0 first."))
    unknown = [n for n in nodes if n not in known]
    if unknown:
        errors.append(_err(where + ".nodes", unknown, "are not hosts of this inventory", "Use inventory host names."))
    backend = engine.get("backend") or "mp"
    if backend not in ("mp", "ray"):
        errors.append(_err(where + ".backend", backend, "is not mp or ray", "Use mp (vLLM >= 0.12) or ray."))
    head = nodes[0]
    if head in known and not addrs.get(head):
        errors.append(
            _err("uma_cluster_addr", None, "is unknown for rank-0 host %s of engine %s" % (head, engine.get("name")),
                 "Set uma_cluster_addr (its ConnectX address) in host_vars/%s.yml." % head)
        )  # fmt: skip
    errors.extend(_check_cluster_addrs(engine, head, addrs, settings))
    ports = {}
    for key in ("port", "master_port", "link_port", "ray_port"):
        value = engine.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            if key != "port":  # the API port is checked with every engine
                errors.append(_err(where + "." + key, value, "is not a TCP port", "Use a number from 1 to 65535."))
        elif value in ports:
            errors.append(
                _err(where + "." + key, value, "is also the engine's %s" % ports[value],
                     "Give port, master_port, link_port and ray_port different numbers.")
            )  # fmt: skip
        else:
            ports[value] = key
    plan = engine.get("plan") or {}
    world = int(plan.get("tensor_parallel_size") or 1) * int(plan.get("pipeline_parallel_size") or 1)
    if world % len(nodes) or world < len(nodes):
        errors.append(
            _err(where + ".plan.tensor_parallel_size", plan.get("tensor_parallel_size", 1),
                 "x pipeline_parallel_size %s does not spread over %d nodes"
                 % (plan.get("pipeline_parallel_size", 1), len(nodes)),
                 "Make tensor_parallel_size x pipeline_parallel_size a multiple of the node count "
                 "(one GPU per DGX Spark: tensor_parallel_size %d)." % len(nodes))
        )  # fmt: skip
    if plan.get("distributed_executor_backend"):
        errors.append(
            _err(where + ".plan.distributed_executor_backend", plan.get("distributed_executor_backend"),
                 "is set by the role for multi-node engines", "Choose with the engine's backend: mp or ray.")
        )  # fmt: skip
    return errors


# --------------------------------------------------------------------------
# Command lines


def planned_args(argv: Any) -> List[str]:
    """The flags of a vllm_flags argv ``[vllm, serve, MODEL, flags...]``."""
    if not isinstance(argv, list) or len(argv) < 3 or list(argv[:2]) != ["vllm", "serve"]:
        raise EngineModelError("vllm_flags returned %r, not [vllm, serve, MODEL, ...]" % (argv,))
    return [str(word) for word in argv[3:]]


def ray_args(args: List[str]) -> List[str]:
    """Planned multi-node mp flags -> the flags of the Ray head: vLLM refuses --nnodes with Ray
    ('nnodes > 1 can only be set when distributed executor backend is mp, uni or external_launcher');
    Ray places the ranks itself."""
    return [*strip_flags(args, MULTINODE_WITH_VALUE, MULTINODE_BARE), "--distributed-executor-backend", "ray"]


def cluster_env(
    cluster: Optional[Dict[str, Any]], settings: Dict[str, Any], head_addr: Optional[str]
) -> Dict[str, str]:
    """Interface and address variables of NVIDIA's two-Spark recipe, per host."""
    if not cluster:
        return {}
    env: Dict[str, str] = {}
    ifnames = settings.get("ifnames") or {}
    for key, kind in (
        ("NCCL_SOCKET_IFNAME", "nccl"),
        ("GLOO_SOCKET_IFNAME", "gloo"),
        ("TP_SOCKET_IFNAME", "gloo"),
        ("UCX_NET_DEVICES", "ucx"),
        ("OMPI_MCA_btl_tcp_if_include", "nccl"),
    ):
        if ifnames.get(kind):
            env[key] = str(ifnames[kind])
    node_addr = settings.get("node_addr")
    if node_addr:
        env["VLLM_HOST_IP"] = str(node_addr)
    if head_addr:
        env["MASTER_ADDR"] = str(head_addr)
    if cluster["backend"] == "ray":
        env["RAY_memory_monitor_refresh_ms"] = "0"
        if node_addr:
            env["RAY_NODE_IP_ADDRESS"] = str(node_addr)
            env["RAY_OVERRIDE_NODE_IP_ADDRESS"] = str(node_addr)
    return env


def ray_script(cluster: Dict[str, Any], settings: Dict[str, Any], head_addr: Optional[str]) -> str:
    """The ``sh -c`` script of a Ray rank: the head starts Ray then execs the engine, a worker
    only joins the Ray cluster."""
    ray_cmd = " ".join(shlex.quote(str(w)) for w in (settings.get("ray_command") or ["ray"]))
    node_addr = settings.get("node_addr")
    ip_opt = " --node-ip-address=%s" % shlex.quote(str(node_addr)) if node_addr else ""
    if cluster["rank"] > 0:
        # NVIDIA's recipe (vLLM examples/online_serving/run_cluster.sh): the worker only joins
        # the Ray cluster; words the launcher appends after the script are ignored by sh.
        return "exec %s start --block --address=%s:%d%s" % (
            ray_cmd, shlex.quote(str(head_addr)), cluster["ray_port"], ip_opt)  # fmt: skip
    return '%s start --head --port=%d%s && exec "$0" "$@"' % (ray_cmd, cluster["ray_port"], ip_opt)


def engine_link(engine: Dict[str, Any], settings: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The engine's cluster link on this node as the role worked it out (``settings["links"]``, from
    the filter vllm_service_rdma_links: service/rdma_link.py); None for a single-node engine or
    where it was not worked out (TCP sockets, nothing added)."""
    if not engine.get("cluster"):
        return None
    found = (settings.get("links") or {}).get(engine.get("name"))
    return None if found is None else rdma_link.checked(engine.get("name"), found)


def engine_command(
    engine: Dict[str, Any], settings: Dict[str, Any], env_names: List[str], script: Optional[str], worker: bool
) -> Tuple[List[str], Any]:
    """The launcher's command (before the model) and model flag, for the engine's runtime."""
    runtime = engine.get("runtime") or settings["runtime"]
    if runtime == "container":
        image = engine.get("image") or settings["image"]
        ray = bool(script)
        secret_names = set(engine.get("secret_names") or [])
        secrets_file = container_secrets_file(settings, engine["name"]) if secret_names else None
        if script:
            # a Ray rank's script: "$0" "$@" is `vllm serve` (the head) or nothing (a worker)
            words = ["vllm", "serve"] if not worker else ["sh"]
        elif secrets_file:
            # the wrapper replaces the image's entrypoint, so the command is explicit (vllm/vllm-openai's
            # entrypoint is `vllm serve`); sh -c SCRIPT sh WORDS...: the launcher appends the model
            script = 'exec "$@"'
            words = ["sh", *(_container_command(settings, engine, image) or ["vllm", "serve"])]
        if secrets_file:
            script = SOURCE_SECRETS + script
        env_only = [key for key in env_names if key not in secret_names]
        link = engine_link(engine, settings) or {}
        prefix = container_prefix(
            settings, engine["name"], engine["model_path"], env_only, image, "/bin/sh" if script else None,
            secrets_file, link.get("container_options"),
        )  # fmt: skip
        if script:
            command = [*prefix, "-c", script, *words]
        else:
            command = prefix + _container_command(settings, engine, image)
        # `vllm serve MODEL` in the image unless the engine's command wants e.g. --model
        model_flag = engine.get("model_flag") if engine.get("model_flag") is not None and not ray else ""
        return command, model_flag
    native = list(engine.get("command") or settings.get("native_command") or [])
    model_flag = engine.get("model_flag")
    if model_flag is None:
        model_flag = settings.get("native_model_flag") or ""
    if script:
        return ["/bin/sh", "-c", script, *(native if not worker else ["sh"])], model_flag
    return native, model_flag


def health_url(engine: Dict[str, Any], host: str, port: int, worker: bool, head_addr: Optional[str]) -> str:
    """The engine's own health_url, else the API of this node (or of rank 0 for a headless rank)."""
    if engine.get("health_url"):
        return engine["health_url"]
    # a headless rank has no API: its load is done when rank 0 serves
    api_host = head_addr if worker and host in WILDCARD_HOSTS else host
    return api_url(api_host, "%d" % port)


def launch_config(
    engine: Dict[str, Any], plan: Dict[str, Any], settings: Dict[str, Any], addrs: Dict[str, Any]
) -> Dict[str, Any]:
    """The engine mapping for uma.vllm.launch_wrapper (tasks_from: engine)."""
    cluster = engine.get("cluster")
    args = planned_args(plan["argv"])
    head_addr = addrs.get(cluster["head"]) if cluster else None
    env = {str(k): str(v) for k, v in (plan.get("env") or engine.get("env") or {}).items()}
    env.update(cluster_env(cluster, settings, head_addr))
    # RDMA on the cluster link: NCCL_IB_HCA, NCCL_IB_GID_INDEX (service/rdma_link.py; TCP: nothing)
    env.update((engine_link(engine, settings) or {}).get("env") or {})
    host = engine.get("host") or settings.get("api_host") or "127.0.0.1"
    port = int(engine["port"])
    ray = bool(cluster) and cluster["backend"] == "ray"
    worker = bool(cluster) and cluster["rank"] > 0
    script = ray_script(cluster, settings, head_addr) if ray else None
    if ray and not worker:
        args = ray_args(args)
    env_names = [*env, *(engine.get("secret_names") or [])]
    command, model_flag = engine_command(engine, settings, env_names, script, ray and worker)
    config: Dict[str, Any] = {
        "name": engine["name"],
        "command": [str(w) for w in command],
        "model_path": engine["model_path"],
        "model_flag": model_flag,
        "host": host,
        "port": port,
        "args": [] if (ray and worker) else args,
        "env": env,
        # the budget (kept in every launch record) and vllm_flags' table of it
        "plan": dict(plan.get("budget") or {}, table=plan.get("msg")) if plan.get("msg") else plan.get("budget"),
        "health_url": health_url(engine, host, port, worker, head_addr),
    }
    for key in ("guard_mode", "readahead_kb", "pre_evict"):
        if engine.get(key) is not None:
            config[key] = engine[key]
    if settings.get("health_timeout_s") not in (None, ""):
        # the launcher stops an engine not healthy after this: the same bound as the play's wait
        # (vllm_service_health_timeout_s), not launch_wrapper's node-wide default (issue 21)
        config["health_timeout_s"] = float(settings["health_timeout_s"])
    if cluster:
        # the launchers of the ranks meet on rank 0 before loading and stop together
        config["cluster"] = {
            "rank": cluster["rank"],
            "nnodes": cluster["nnodes"],
            "head_addr": head_addr,
            "link_port": cluster["link_port"],
            "peer_timeout_s": float(settings.get("peer_timeout_s") or 600),
            # a Ray worker runs `ray start`, not the engine's argv: nothing to compare
            "compare": not ray,
        }
        if settings.get("secrets_dir"):
            # the engine's link key (0600 root, made on the controller): the link is signed with it
            config["cluster"]["key_file"] = link_key_file(settings["secrets_dir"], engine["name"])
        if cluster["rank"] == 0:
            # rank 0 is the head: its link listens on its own cluster-link address, not on every address
            config["cluster"]["bind_addr"] = head_addr
    return config


def launch_configs(
    results: List[Dict[str, Any]], settings: Dict[str, Any], addrs: Dict[str, Any]
) -> List[Dict[str, Any]]:
    """launch_config for every registered uma.vllm.vllm_flags loop result (``item`` = the engine)."""
    return [launch_config(r["item"], r, settings, addrs) for r in results]


def role_text(engine: Dict[str, Any]) -> str:
    cluster = engine.get("cluster")
    if not cluster:
        return "single node"
    if cluster["rank"] == 0:
        what = "serves the API" if cluster["backend"] == "mp" else "Ray head, serves the API"
    else:
        what = "headless" if cluster["backend"] == "mp" else "Ray worker"
    return "rank %d of %d, %s, %s" % (cluster["rank"], cluster["nnodes"], cluster["backend"], what)


def images(engines: List[Dict[str, Any]], settings: Dict[str, Any]) -> List[str]:
    """Images of this host's container-runtime engines, each once."""
    out: List[str] = []
    for engine in engines:
        if (engine.get("runtime") or settings.get("runtime")) != "container":
            continue
        image = engine.get("image") or settings.get("image")
        if image and image not in out:
            out.append(image)
    return out


def drop_in(engine: Dict[str, Any], settings: Dict[str, Any]) -> Dict[str, Any]:
    """What the per-engine systemd drop-in needs to say."""
    runtime = engine.get("runtime") or settings["runtime"]
    out: Dict[str, Any] = {"role": role_text(engine), "runtime": runtime, "cleanup": None}
    out.update(after=[], requires=[], wants=[])
    if runtime == "container":
        kind = settings.get("container_engine") or "docker"
        binary = settings.get("container_bin") or "/usr/bin/%s" % kind
        out["image"] = engine.get("image") or settings["image"]
        # the Id the image had on the node when the drop-in was written (issue 34 item 5): a tag
        # pulled again onto another Id rewrites the drop-in, so every rank restarts once on it
        image_id = (settings.get("image_ids") or {}).get(out["image"])
        if image_id:
            out["image_id"] = str(image_id)
        out["cleanup"] = "%s rm -f %s" % (binary, container_name(engine["name"]))
        if kind == "docker":
            # Wants=, not Requires=: `systemctl restart docker` stops a unit that requires it, and a
            # rank stopped by systemd is a deliberate stop for its peers (they stay down). Without
            # it the container dies, the rank fails (69) and the whole engine restarts.
            out["after"] = ["docker.service"]
            out["wants"] = ["docker.service"]
    return out
