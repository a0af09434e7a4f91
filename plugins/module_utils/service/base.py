# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every part of the vllm_service engine model shares: the refusal type, the names'
patterns, the fixed ports and paths, and the refusal text. Imported by service/engines.py (which
re-exports these names) and service/container.py. Controller only."""

from __future__ import annotations

import re
from typing import Any, Dict, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.checks import ENV_NAME_RE
from ansible_collections.uma.vllm.plugins.module_utils.node.base.paths import ENGINE_NAME_PATTERN


class EngineModelError(ValueError):
    """A refusal of the engine model; its text names the option, the value and the fix.
    The filter plugins turn it into AnsibleFilterError with the same text."""


NAME_RE = re.compile(ENGINE_NAME_PATTERN)
ENV_RE = ENV_NAME_RE  # node/base/checks.py: the one rule for an environment variable's name
MULTINODE_WITH_VALUE = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--distributed-executor-backend")
MULTINODE_BARE = ("--headless",)
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
# vLLM's own cache (VLLM_CACHE_ROOT's default for root): torch.compile artifacts, the model
# registry's inspection results, kernel JIT caches; kept on the node so that a new container of
# the engine does not build them again
VLLM_CACHE_IN_CONTAINER = "/root/.cache/vllm"
CONTAINER_PREFIX = "uma-vllm-"
DEFAULT_MASTER_PORT = 29501
DEFAULT_RAY_PORT = 6379
# The ports a multi-node engine derives from its master_port (each overridable where named):
# the launchers' rank link (plugins/module_utils/node/cluster/ranks.py) on rank 0 (link_port), the
# watchdogs' status on every node (watchdog_port), rank 0's model copy to the other ranks (model_copy)
LINK_PORT_OFFSET = 10
STATUS_PORT_OFFSET = 11
COPY_PORT_OFFSET = 12
# Issue 19 item 6: a container engine's secrets are not `-e NAME` (docker/podman inspect shows
# Config.Env): the container reads them from its 0600 file, bind-mounted read-only here, and a
# /bin/sh entrypoint exports them before it execs the engine.
SECRETS_IN_CONTAINER = "/run/uma-vllm/secrets.env"
SOURCE_SECRETS = "set -a; . %s; set +a; " % SECRETS_IN_CONTAINER
DEFAULT_SECRETS_DIR = "/etc/uma-vllm/engines"


def _err(option: str, value: Any, problem: str, fix: str) -> str:
    return "%s = %r %s. Fix: %s" % (option, value, problem, fix)


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def api_url(host: Any, port: Any, path: str = "/health") -> str:
    """The one rule for an engine's own URL on its node: a wildcard bind address is reached on 127.0.0.1,
    an IPv6 address in brackets (the default health URL of the engine model, the launcher and the watchdog)."""
    host = "127.0.0.1" if str(host) in WILDCARD_HOSTS else str(host)
    if ":" in host:
        host = "[%s]" % host
    return "http://%s:%s%s" % (host, port, path)


def node_ports(engine: Dict[str, Any]) -> Dict[int, Tuple[str, str]]:
    """The TCP ports an engine listens on on this node: port -> (the engine key that sets it, what listens).

    ``engine`` as ``engines.host_engines`` gives it (``cluster`` set for a multi-node engine, with
    this node's rank): the API on rank 0 (or the single node); on rank 0 of a multi-node engine the
    torch.distributed store (master_port), the rank link and the model copy, and Ray's head with
    the Ray backend; on every node of it the watchdogs' status port. A value that is not a port
    number is left out (the engine's own checks name it)."""
    ports: Dict[int, Tuple[str, str]] = {}

    def claim(value: Any, key: str, what: str) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
            ports.setdefault(value, (key, what))

    cluster = engine.get("cluster")
    if engine.get("api_rank", True):
        claim(engine.get("port"), "port", "API")
    if isinstance(cluster, dict):
        master = cluster.get("master_port")
        master = master if isinstance(master, int) and not isinstance(master, bool) else None
        if engine.get("watchdog_port"):
            claim(engine.get("watchdog_port"), "watchdog_port", "watchdog status")
        elif master:
            claim(
                master + STATUS_PORT_OFFSET,
                "master_port",
                "watchdog status (master_port + %d)" % STATUS_PORT_OFFSET,
            )
        if cluster.get("rank") == 0:
            claim(master, "master_port", "torch.distributed store")
            link_key = "link_port" if engine.get("link_port") else "master_port"
            claim(cluster.get("link_port"), link_key, "rank link")
            if master:
                claim(master + COPY_PORT_OFFSET, "master_port", "model copy (master_port + %d)" % COPY_PORT_OFFSET)
            if cluster.get("backend") == "ray":
                claim(cluster.get("ray_port"), "ray_port", "Ray head")
    return ports
