# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the launch_wrapper role writes for one engine: the launcher's per-engine config
``<config_dir>/engines/<name>.json`` (read on the node by uma_launch.py through
node/launch/config.py). Used by the role itself (``launch_wrapper_engines``) and by
uma.vllm.vllm_service, through the filter ``uma.vllm.launch_wrapper_engine_config``
(plugins/filter/launch_wrapper.py). Pure; the role renders the result with
``to_nice_json(indent=2)``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.node.base.paths import ENGINE_NAME_PATTERN
from ansible_collections.uma.vllm.plugins.module_utils.service.base import api_url

MANAGED = "Managed by uma.vllm (role launch_wrapper); local edits are reverted on the next run"
USER_KEYS = ("engine_user", "engine_group", "engine_groups", "engine_home")


class EngineConfigError(ValueError):
    """An engine mapping the launcher config cannot be written from (the message says why and how)."""


def check_name(engine: Dict[str, Any]) -> str:
    name = engine.get("name") if isinstance(engine, dict) else None
    if not isinstance(name, str) or not re.fullmatch(ENGINE_NAME_PATTERN, name):
        raise EngineConfigError(
            "launch_wrapper_engines[].name = %r is not a valid engine name. Use up to 64 letters, digits, '.', "
            "'_' or '-', starting with a letter or digit." % (name,)
        )
    return name


def _model_args(engine: Dict[str, Any]) -> List[Any]:
    flag = engine.get("model_flag", "--model")
    return [engine["model_path"]] if flag == "" else [flag, engine["model_path"]]


def _health_url(engine: Dict[str, Any]) -> Any:
    if "health_url" in engine:
        return engine["health_url"]
    return api_url(engine.get("host", "127.0.0.1"), engine["port"])


def _user(engine: Dict[str, Any]) -> Dict[str, Any]:
    """Least privilege (vllm_service_user): absent when unset, so configs written before stay the same."""
    if engine.get("user") in (None, ""):
        return {}
    return {
        "engine_user": engine["user"],
        "engine_group": engine.get("group"),
        "engine_groups": engine.get("groups"),
        "engine_home": engine.get("home"),
    }


def _check_env(name: str, env: Any) -> None:
    """What the launcher takes (_launch_config): names of letters, digits and '_'; strings or numbers.

    Refused here, before a file changes on a node, instead of by the launcher at the engine's start.
    """
    if not isinstance(env, dict):
        raise EngineConfigError("launch_wrapper_engines[%s].env = %r is not a mapping. Give NAME: value." % (name, env))
    for key, value in env.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise EngineConfigError(
                "launch_wrapper_engines[%s].env: %r is not an environment variable name. Use letters, digits and "
                "'_', not starting with a digit." % (name, key)
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or "\x00" in str(value):
            raise EngineConfigError(
                "launch_wrapper_engines[%s].env.%s = %r is not a string or a number. Quote it, e.g. '1' or 'true'."
                % (name, key, value)
            )


def engine_config(engine: Dict[str, Any], managed: Optional[str] = None) -> Dict[str, Any]:
    """The launcher config of one engine mapping (name, command, model_path, port, ...)."""
    name = check_name(engine)
    for key in ("command", "model_path", "port"):
        if key not in engine:
            raise EngineConfigError("launch_wrapper_engines[%s] has no '%s'. Give the engine's %s." % (name, key, key))
    _check_env(name, engine.get("env", {}))
    config: Dict[str, Any] = {
        "_comment": MANAGED if managed is None else managed,
        "engine": name,
        "command": list(engine["command"])
        + _model_args(engine)
        + ["--host", engine.get("host", "127.0.0.1"), "--port", str(engine["port"])]
        + [str(arg) for arg in engine.get("args") or []],
        "model_path": engine["model_path"],
        "health_url": _health_url(engine),
        "env": engine.get("env", {}),
        # null means "the node-wide default" to the launcher
        "guard_mode": engine.get("guard_mode"),
        "readahead_kb": engine.get("readahead_kb"),
        "pre_evict": engine.get("pre_evict"),
        "plan": engine.get("plan"),
        # a rank of a multi-node engine: the launchers' rank link (uma.vllm.vllm_service)
        "cluster": engine.get("cluster"),
    }
    if engine.get("health_timeout_s") is not None:
        # the engine's own bound (vllm_service_health_timeout_s) over the node's launch.json
        config["health_timeout_s"] = engine["health_timeout_s"]
    config.update(_user(engine))
    return config
