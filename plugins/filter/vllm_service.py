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
import importlib
from typing import Any, Callable, List

from ansible.errors import AnsibleFilterError
from ansible.plugins.filter.core import to_nice_json

_MODULE_UTILS = "ansible_collections.uma.vllm.plugins.module_utils."


def _refusal() -> type:
    return importlib.import_module(_MODULE_UTILS + "service.base").EngineModelError


def as_filter(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with the model's refusals raised as AnsibleFilterError (same message)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except _refusal() as err:
            raise AnsibleFilterError(str(err)) from None

    return wrapper


def lazy(target: str, refusals: bool = True) -> Callable[..., Any]:
    """The function ``target`` (``"service.engines:host_engines"``: module under plugins/module_utils,
    function), imported at its first call; with ``refusals`` the model's refusals (EngineModelError)
    reach Ansible as AnsibleFilterError with the same text.

    Why lazily: to find one ``uma.vllm.<filter>`` ansible-core loads every file of plugins/filter
    (Jinja2Loader.get_with_context), in the worker process of each task and host, so whatever these
    files import at their top is paid by every task that templates one of the collection's filters:
    0.2 s per task and host with all the module_utils they use (the whole node package among them,
    for the watchdog configs' fingerprint), about 50 such tasks in a no-op site.yml, two cores.
    """
    module, _sep, name = target.partition(":")
    resolved: List[Callable[..., Any]] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not resolved:
            resolved.append(getattr(importlib.import_module(_MODULE_UTILS + module), name))
        if not refusals:
            return resolved[0](*args, **kwargs)
        try:
            return resolved[0](*args, **kwargs)
        except _refusal() as err:
            raise AnsibleFilterError(str(err)) from None

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = "%s of plugins/module_utils/%s.py (imported at the first call)" % (name, module.replace(".", "/"))
    return wrapper


host_engines = lazy("service.engines:host_engines")
secrets = lazy("service.engines:secrets")
check = lazy("service.engines:check")
settings_errors = lazy("service.engines:settings_errors")
engine_user = lazy("service.engines:engine_user")
user_keys = lazy("service.engines:user_keys")
hardening = lazy("service.engines:hardening")
planned_args = lazy("service.engines:planned_args")
ray_args = lazy("service.engines:ray_args")
launch_config = lazy("service.engines:launch_config")
launch_configs = lazy("service.engines:launch_configs")
images = lazy("service.engines:images")
drop_in = lazy("service.engines:drop_in")
head_addrs = lazy("service.state:head_addrs")
peers_changed = lazy("service.state:peers_changed")
prune_plan = lazy("service.state:prune_plan")
files_state = lazy("service.files:files_state")
file_as_wanted = lazy("service.files:file_as_wanted")
status_entry = lazy("service.state:status_entry")
changed = lazy("service.state:changed")
with_peers = lazy("service.state:with_peers")
unit_actions = lazy("service.state:unit_actions")
shell_env = lazy("service.container:shell_env")
hub_engines = lazy("service.hub:hub_engines")
hub_errors = lazy("service.hub:hub_errors")
hub_fetched = lazy("service.hub:fetched")
hub_commits = lazy("service.hub:commits")
hub_rank_errors = lazy("service.hub:rank_errors")
hub_copy_receives = lazy("service.hub_copy:receives")
hub_copy_servers = lazy("service.hub_copy:servers")
hub_stand_ins = lazy("service.hub_copy:stand_ins")
firewall_rules = lazy("service.firewall:firewall_rules")
rdma_links = lazy("service.rdma_link:links")
link_view = lazy("service.link_preflight:view")
link_preflight_checks = lazy("service.link_preflight:preflight")
model_paths = lazy("service.model_presence:paths")
model_presence_checks = lazy("service.model_presence:presence")
model_path_indexes = lazy("service.model_presence:indexes")
model_path_receives = lazy("service.model_presence:receives")
model_path_servers = lazy("service.model_presence:servers")
model_path_stand_ins = lazy("service.model_presence:stand_ins")
version_probes = lazy("service.version:probes", refusals=False)
version_probe_argv = lazy("service.version:probe_argv", refusals=False)
version_cache_entries = lazy("service.version:cache_entries", refusals=False)
version_cache_update = lazy("service.version:cache_update", refusals=False)
version_image_versions = lazy("service.version:image_versions", refusals=False)
version_engine_versions = lazy("service.version:engine_versions", refusals=False)
version_images_arch_errors = lazy("service.version:images_arch_errors", refusals=False)
version_to_probe = lazy("service.version:to_probe", refusals=False)
version_to_pull = lazy("service.version:to_pull", refusals=False)
version_moved = lazy("service.version:moved", refusals=False)
version_image_ids = lazy("service.version:image_ids", refusals=False)
version_pull_policy = lazy("service.version:pull_policy", refusals=False)
version_settings_errors = lazy("service.version:settings_errors", refusals=False)


def version_scripts(_unused: Any = None) -> Any:
    """The probes' texts: ``probe`` (run by the image's or venv's python), ``native`` (run by
    the node's python with the venv python or command word and ``probe`` as arguments)."""
    version = importlib.import_module(_MODULE_UTILS + "service.version")
    return {"probe": version.PROBE, "native": version.native_probe_script()}


def node_files(renders: Any, launch_files: Any, watchdogs: Any, paths: Any) -> Any:
    """The arguments of the role's uma.vllm.node_files task (JSON as ansible-core's to_nice_json(indent=2))."""
    files = importlib.import_module(_MODULE_UTILS + "service.files")
    return files.node_files(renders, launch_files, watchdogs, paths, lambda value: to_nice_json(value, indent=2))


container_name = lazy("service.container:container_name", refusals=False)  # not a filter: the tests use it


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
            "vllm_service_file_as_wanted": file_as_wanted,
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
            "vllm_service_version_probes": version_probes,
            "vllm_service_version_probe_argv": version_probe_argv,
            "vllm_service_version_cache": version_cache_entries,
            "vllm_service_version_cache_update": version_cache_update,
            "vllm_service_image_versions": version_image_versions,
            "vllm_service_engine_versions": version_engine_versions,
            "vllm_service_images_arch_errors": version_images_arch_errors,
            "vllm_service_images_to_probe": version_to_probe,
            "vllm_service_images_to_pull": version_to_pull,
            "vllm_service_images_moved": version_moved,
            "vllm_service_image_ids": version_image_ids,
            "vllm_service_pull_policy": version_pull_policy,
            "vllm_service_version_settings_errors": version_settings_errors,
        }
