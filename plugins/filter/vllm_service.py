# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the uma.vllm.vllm_service role: thin wrappers over the engine model in
plugins/module_utils/service/engines.py (engines, checks, engine user, launcher configs, drop-ins),
service/state.py (restarts, unit states, status), service/hub.py (models from the Hub),
service/hub_copy.py (a multi-node engine's model copied from rank 0),
service/rdma_link.py (a multi-node engine's cluster link: RDMA or TCP sockets),
service/link_preflight.py (that link checked on all the engine's nodes before anything changes),
service/model_presence.py (every node of an engine has its model_path, or it is copied from one that has it)
and service/files.py (the arguments of the role's uma.vllm.node_files task, fingerprints).
A refusal of the model (EngineModelError) reaches Ansible as AnsibleFilterError with the same text.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ansible.errors import AnsibleFilterError
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.uma.vllm.plugins.module_utils.service import (
    container,
    files,
    firewall,
    hub,
    hub_copy,
    link_preflight,
    model_presence,
    rdma_link,
    state,
    version,
)
from ansible_collections.uma.vllm.plugins.module_utils.service import engines as model
from ansible_collections.uma.vllm.plugins.module_utils.service.engines import EngineModelError


def as_filter(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with the model's refusals raised as AnsibleFilterError (same message)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EngineModelError as err:
            raise AnsibleFilterError(str(err)) from None

    return wrapper


host_engines = as_filter(model.host_engines)
secrets = as_filter(model.secrets)
check = as_filter(model.check)
settings_errors = as_filter(model.settings_errors)
engine_user = as_filter(model.engine_user)
user_keys = as_filter(model.user_keys)
hardening = as_filter(model.hardening)
planned_args = as_filter(model.planned_args)
ray_args = as_filter(model.ray_args)
launch_config = as_filter(model.launch_config)
launch_configs = as_filter(model.launch_configs)
images = as_filter(model.images)
drop_in = as_filter(model.drop_in)
head_addrs = as_filter(state.head_addrs)
peers_changed = as_filter(state.peers_changed)
prune_plan = as_filter(state.prune_plan)
files_state = as_filter(files.files_state)
status_entry = as_filter(state.status_entry)
changed = as_filter(state.changed)
with_peers = as_filter(state.with_peers)
unit_actions = as_filter(state.unit_actions)
shell_env = as_filter(container.shell_env)
hub_engines = as_filter(hub.hub_engines)
hub_errors = as_filter(hub.hub_errors)
hub_fetched = as_filter(hub.fetched)
hub_commits = as_filter(hub.commits)
hub_rank_errors = as_filter(hub.rank_errors)
hub_copy_receives = as_filter(hub_copy.receives)
hub_copy_servers = as_filter(hub_copy.servers)
hub_stand_ins = as_filter(hub_copy.stand_ins)
firewall_rules = as_filter(firewall.firewall_rules)
rdma_links = as_filter(rdma_link.links)
link_view = as_filter(link_preflight.view)
link_preflight_checks = as_filter(link_preflight.preflight)
model_paths = as_filter(model_presence.paths)
model_presence_checks = as_filter(model_presence.presence)
model_path_indexes = as_filter(model_presence.indexes)
model_path_receives = as_filter(model_presence.receives)
model_path_servers = as_filter(model_presence.servers)
model_path_stand_ins = as_filter(model_presence.stand_ins)


def version_scripts(_unused: Any = None) -> Any:
    """The probes' texts: ``probe`` (run by the image's or venv's python), ``native`` (run by
    the node's python with the venv python or command word and ``probe`` as arguments)."""
    return {"probe": version.PROBE, "native": version.native_probe_script()}


def node_files(renders: Any, launch_files: Any, watchdogs: Any, paths: Any) -> Any:
    """The arguments of the role's uma.vllm.node_files task (JSON as ansible-core's to_nice_json(indent=2))."""
    return files.node_files(renders, launch_files, watchdogs, paths, lambda value: to_nice_json(value, indent=2))


container_name = model.container_name  # not a filter: the tests and integration tests use it


class FilterModule:
    def filters(self):
        return {
            "vllm_service_host_engines": host_engines,
            "vllm_service_check": check,
            "vllm_service_settings_errors": settings_errors,
            "vllm_service_engine_user": engine_user,
            "vllm_service_user_keys": user_keys,
            "vllm_service_hardening": hardening,
            "vllm_service_secrets": secrets,
            "vllm_service_launch_configs": launch_configs,
            "vllm_service_head_addrs": head_addrs,
            "vllm_service_peers_changed": peers_changed,
            "vllm_service_prune_plan": prune_plan,
            "vllm_service_files_state": files_state,
            "vllm_service_node_files": node_files,
            "vllm_service_images": images,
            "vllm_service_status_entry": status_entry,
            "vllm_service_drop_in": drop_in,
            "vllm_service_changed": changed,
            "vllm_service_with_peers": with_peers,
            "vllm_service_firewall_rules": firewall_rules,
            "vllm_service_rdma_links": rdma_links,
            "vllm_service_link_view": link_view,
            "vllm_service_link_preflight": link_preflight_checks,
            "vllm_service_model_paths": model_paths,
            "vllm_service_model_presence": model_presence_checks,
            "vllm_service_model_path_indexes": model_path_indexes,
            "vllm_service_model_path_receives": model_path_receives,
            "vllm_service_model_path_servers": model_path_servers,
            "vllm_service_model_path_stand_ins": model_path_stand_ins,
            "vllm_service_unit_actions": unit_actions,
            "vllm_service_shell_env": shell_env,
            "vllm_service_hub_engines": hub_engines,
            "vllm_service_hub_errors": hub_errors,
            "vllm_service_hub_fetched": hub_fetched,
            "vllm_service_hub_commits": hub_commits,
            "vllm_service_hub_rank_errors": hub_rank_errors,
            "vllm_service_hub_copy_receives": hub_copy_receives,
            "vllm_service_hub_copy_servers": hub_copy_servers,
            "vllm_service_hub_stand_ins": hub_stand_ins,
            "vllm_service_version_scripts": version_scripts,
            "vllm_service_version_probes": version.probes,
            "vllm_service_version_probe_argv": version.probe_argv,
            "vllm_service_version_cache": version.cache_entries,
            "vllm_service_version_cache_update": version.cache_update,
            "vllm_service_image_versions": version.image_versions,
            "vllm_service_engine_versions": version.engine_versions,
            "vllm_service_images_arch_errors": version.images_arch_errors,
            "vllm_service_images_to_probe": version.to_probe,
            "vllm_service_images_to_pull": version.to_pull,
            "vllm_service_images_moved": version.moved,
            "vllm_service_image_ids": version.image_ids,
            "vllm_service_pull_policy": version.pull_policy,
            "vllm_service_version_settings_errors": version.settings_errors,
        }
