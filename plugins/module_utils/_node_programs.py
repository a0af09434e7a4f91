# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's node-side programs, as one tuple of loaded modules.

The launcher (``uma_launch``), the page-cache guard (``uma_guard``) and the engine watchdog
(``uma_watchdog``) run on the node from one directory (``_paths.LIB_DIR``) with the node's
python3 and no Ansible, so they ship with every sibling they import.
:data:`NODE_PROGRAMS` is that set - the three programs and their import closure.

The imports below are static on purpose: AnsiballZ ships exactly the module_utils a module
imports, so ``uma.vllm.node_files`` (``programs: true``) carries every one of these files in
its payload and installs them from there (``_nodefiles.module_source``).
tests/unit/plugins/module_utils/test_node_programs.py checks that the tuple is the import
closure of the three programs (nothing missing, nothing extra).
"""

from __future__ import annotations

from ansible_collections.uma.vllm.plugins.module_utils import (
    _blockdev,
    _common,
    _config_checks,
    _guard_config,
    _guard_memory,
    _guard_residency,
    _guard_status,
    _guard_sweeper,
    _guard_watch,
    _launch_config,
    _launch_node,
    _link_auth,
    _memavail,
    _metrics,
    _paths,
    _ranks,
    _sysctl,
    _sysctl_files,
    _systemd,
    _watchdog_counters,
    _watchdog_logic,
    _watchdog_probes,
    uma_guard,
    uma_launch,
    uma_watchdog,
)

# In the order of roles/launch_wrapper/vars/main.yml __launch_wrapper_programs.
NODE_PROGRAMS = (
    _common,
    _paths,
    _blockdev,
    uma_guard,
    _guard_config,
    _config_checks,
    _guard_memory,
    _guard_residency,
    _guard_status,
    _guard_sweeper,
    _guard_watch,
    _link_auth,
    _ranks,
    _launch_config,
    _launch_node,
    uma_launch,
    _sysctl,
    _sysctl_files,
    _memavail,
    _systemd,
    _metrics,
    _watchdog_counters,
    _watchdog_logic,
    _watchdog_probes,
    uma_watchdog,
)


def program_names() -> list:
    """The file names the programs are installed as (``_common.py``, ...)."""
    return [module.__name__.rpartition(".")[2] + ".py" for module in NODE_PROGRAMS]
