# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the uma.vllm.launch_wrapper role (also used by uma.vllm.vllm_service): each engine's
launcher config, thin wrappers over plugins/module_utils/service/launch_wrapper.py.

- ``launch_wrapper_engine_config``: one engine mapping -> the config (a dict);
- ``launch_wrapper_engine_files``: engine mappings -> ``uma.vllm.node_files`` entries
  ``{path: <config_dir>/engines/<name>.json, mode: "0644", content}``, the content rendered by
  ansible-core's own ``to_nice_json(indent=2)`` plus a newline (what the role has always written);
- ``launch_wrapper_node_config_errors``: the node-wide ``launch.json`` the role renders -> the
  messages of the launcher's own checks it fails (``_launch_config.check_node_values``), each
  naming the role variable; empty when the launcher takes it.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List, Optional

from ansible.errors import AnsibleFilterError
from ansible.plugins.filter.core import to_nice_json

# module_utils are imported at the first call, not at the top: see lazy() in vllm_service.py
_MODULE_UTILS = "ansible_collections.uma.vllm.plugins.module_utils."


def engine_config(engine: Dict[str, Any], managed: Optional[str] = None) -> Dict[str, Any]:
    model = importlib.import_module(_MODULE_UTILS + "service.launch_wrapper")
    try:
        return model.engine_config(engine, managed)
    except model.EngineConfigError as err:
        raise AnsibleFilterError(str(err)) from None


def engine_files(engines: List[Dict[str, Any]], config_dir: str, managed: Optional[str] = None) -> List[Dict[str, Any]]:
    return [
        {
            "path": "%s/engines/%s.json" % (config_dir, engine["name"]),
            "mode": "0644",
            "content": to_nice_json(engine_config(engine, managed), indent=2) + "\n",
        }
        for engine in engines or []
    ]


# launch.json keys whose role variable is not launch_wrapper_<key>
_ROLE_VARIABLE = {
    "guard_interval": "launch_wrapper_guard_interval_s",
    "guard_max_duration": "launch_wrapper_guard_max_duration_s",
}


def node_config_errors(config: Dict[str, Any]) -> List[str]:
    """What the launcher would refuse in the node-wide launch.json, at every engine start (exit 78)."""
    if not isinstance(config, dict):
        raise AnsibleFilterError("launch_wrapper_node_config_errors expects a mapping, got %s" % type(config).__name__)
    _launch_config = importlib.import_module(_MODULE_UTILS + "node.launch.config")
    UmaError = importlib.import_module(_MODULE_UTILS + "node.base.common").UmaError
    try:
        _launch_config.check_node_values(config)
    except UmaError as err:
        key = str(err.option).split(".", 1)[0]
        variable = _ROLE_VARIABLE.get(key, "launch_wrapper_" + key)
        return [
            "%s: %s (in launch.json the launcher would refuse it at every engine start, exit 78)"
            % (variable, err.message)
        ]
    return []


class FilterModule:
    def filters(self):
        return {
            "launch_wrapper_engine_config": engine_config,
            "launch_wrapper_engine_files": engine_files,
            "launch_wrapper_node_config_errors": node_config_errors,
        }
