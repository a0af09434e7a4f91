# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the uma.vllm.launch_wrapper role (also used by uma.vllm.vllm_service): each engine's
launcher config, thin wrappers over plugins/module_utils/_launch_wrapper.py.

- ``launch_wrapper_engine_config``: one engine mapping -> the config (a dict);
- ``launch_wrapper_engine_files``: engine mappings -> ``uma.vllm.node_files`` entries
  ``{path: <config_dir>/engines/<name>.json, mode: "0644", content}``, the content rendered by
  ansible-core's own ``to_nice_json(indent=2)`` plus a newline (what the role has always written).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible.errors import AnsibleFilterError
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.uma.vllm.plugins.module_utils import _launch_wrapper as model


def engine_config(engine: Dict[str, Any], managed: Optional[str] = None) -> Dict[str, Any]:
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


class FilterModule:
    def filters(self):
        return {"launch_wrapper_engine_config": engine_config, "launch_wrapper_engine_files": engine_files}
