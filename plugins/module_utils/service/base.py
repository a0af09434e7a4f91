# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every part of the vllm_service engine model shares: the refusal type, the names'
patterns, the fixed ports and paths, and the refusal text. Imported by service/engines.py (which
re-exports these names) and service/container.py. Controller only."""

from __future__ import annotations

import re
from typing import Any

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
# The launchers' rank link (plugins/module_utils/node/cluster/ranks.py) listens on rank 0 at master_port + this.
LINK_PORT_OFFSET = 10
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
