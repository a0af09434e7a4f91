# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The container runtime's command line of a vllm_service engine: the container's name, its
secrets file (sourced by the entrypoint, never ``-e NAME=value``) and the ``docker run`` /
``podman run`` words up to the image. Pure functions, controller only; re-exported by
service/engines.py. Tests: tests/unit/plugins/filter/test_vllm_service.py."""

from __future__ import annotations

import re
import shlex
from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.service.base import (
    CONTAINER_PREFIX,
    DEFAULT_SECRETS_DIR,
    ENV_RE,
    HF_CACHE_IN_CONTAINER,
    SECRETS_IN_CONTAINER,
    VLLM_CACHE_IN_CONTAINER,
    EngineModelError,
    _err,
)


def container_name(name: str) -> str:
    return CONTAINER_PREFIX + name


def container_secrets_file(settings: Dict[str, Any], name: str) -> str:
    """The host path of a container engine's secrets (POSIX sh assignments, 0600 root)."""
    return "%s/%s.container.env" % (settings.get("secrets_dir") or DEFAULT_SECRETS_DIR, name)


def shell_env(secrets: Dict[str, Any]) -> str:
    """The container's secrets file: ``NAME='value'`` lines that ``sh`` sources literally (no
    expansion of ``$``, backquotes or backslashes in single quotes)."""
    lines = []
    for key in sorted(secrets):
        if not ENV_RE.match(str(key)):
            raise EngineModelError(
                _err("secrets", key, "is not an environment variable name", "Use letters, digits and '_'.")
            )
        lines.append("%s=%s" % (key, shlex.quote(str(secrets[key]))))
    return "".join(line + "\n" for line in lines)


def _mountable(text: str) -> bool:
    """A host path ``-v SOURCE:TARGET`` carries as given: absolute, and nothing the option's syntax
    reads (``:`` separates the fields, ``,`` the options of --mount) or a line break could end."""
    return text.startswith("/") and not any(ch in text for ch in ":,\n\r\x00")


def _mount_source(option: str, path: Any) -> str:
    """A host directory for ``-v SOURCE:TARGET`` (``_mountable``), else refused naming the option."""
    text = str(path)
    if not _mountable(text):
        example = "/root/.cache/huggingface" if option == "hf_cache" else "/root/.cache/vllm"
        raise EngineModelError(
            _err(
                "vllm_service_" + option,
                path,
                "is not an absolute directory without ':' ',' or line breaks",
                "Give a directory on the node such as %s." % example,
            )
        )
    return text


# A model_path inside a Hugging Face cache snapshot (<cache>/hub/models--OWNER--NAME/snapshots/<rev>[/sub]):
# its files are relative symlinks into ../../blobs, which dangle in a container that mounts the
# snapshot alone. The repository's directory (models--OWNER--NAME) is mounted instead, at the same
# path, so the links resolve (issue 34 item 3c).
HF_SNAPSHOT_RE = re.compile(r"^(/.*/models--[^/]+)/snapshots/[^/]+(?:/.*)?$")


def model_mount(name: str, model_path: str) -> str:
    """The host directory mounted read-only (at its own path) for ``model_path``: the path, or the
    Hugging Face cache repository it is a snapshot of. Refused where ``-v`` would misread it."""
    text = str(model_path)
    if not _mountable(text):
        raise EngineModelError(
            _err("vllm_service_engines[%s].model_path" % name, model_path,
                 "cannot be mounted into the container (it must be absolute, without ':' ',' or line breaks)",
                 "Move or link the model to a path without them, e.g. /models/Qwen3-32B.")
        )  # fmt: skip
    match = HF_SNAPSHOT_RE.match(text.rstrip("/"))
    return match.group(1) if match else text


def container_prefix(
    settings: Dict[str, Any],
    name: str,
    model_path: str,
    env_names: List[str],
    image: str,
    entrypoint: Optional[str],
    secrets_file: Optional[str] = None,
    link_options: Optional[List[str]] = None,
) -> List[str]:
    """``docker run`` / ``podman run`` up to and including the image. ``secrets_file``: the
    host file mounted read-only at SECRETS_IN_CONTAINER (the entrypoint must source it).
    ``link_options``: what the engine's RDMA cluster link needs (service/rdma_link.py), before the
    role's own container options."""
    kind = settings.get("container_engine") or "docker"
    argv = [
        settings.get("container_bin") or "/usr/bin/%s" % kind,
        "run", "--rm", "--name", container_name(name),
        "--network", "host", "--ipc", "host",
    ]  # fmt: skip
    gpus = settings.get("container_gpus")
    if gpus:
        argv += ["--gpus", str(gpus)] if kind == "docker" else ["--device", "nvidia.com/gpu=%s" % gpus]
    mount = model_mount(name, model_path)
    argv += ["-v", "%s:%s:ro" % (mount, mount)]
    for option, inside in (("hf_cache", HF_CACHE_IN_CONTAINER), ("vllm_cache", VLLM_CACHE_IN_CONTAINER)):
        if settings.get(option):
            argv += ["-v", "%s:%s" % (_mount_source(option, settings[option]), inside)]
    if secrets_file:
        argv += ["-v", "%s:%s:ro" % (secrets_file, SECRETS_IN_CONTAINER)]
    for key in sorted(env_names):
        argv += ["-e", key]  # the value comes from the launcher's environment, never the command line
    if settings.get("oom_score_adj") not in (None, ""):
        # who dies first: the engine's processes (positive), never the watchdog or the guard
        argv += ["--oom-score-adj", str(int(settings["oom_score_adj"]))]
    argv += [str(word) for word in link_options or []]
    argv += [str(word) for word in settings.get("container_options") or []]
    if entrypoint:
        argv += ["--entrypoint", entrypoint]
    argv.append(image)
    return argv


def _container_command(settings: Dict[str, Any], engine: Dict[str, Any], image: str) -> List[str]:
    if engine.get("command") is not None:
        return list(engine["command"])
    if settings.get("container_command") is not None:
        return list(settings["container_command"])
    # vllm/vllm-openai's entrypoint already is `vllm serve`; NGC's runs the given command
    return [] if "vllm-openai" in image else ["vllm", "serve"]
