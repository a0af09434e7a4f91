# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's paths and names on a node, in one place.

Python code imports these constants. Role YAML cannot import Python: the roles spell the same
values in their defaults, argument_specs, vars and templates, and
tests/unit/plugins/module_utils/test_paths.py reads those files and fails, naming the file and
the value, when one of them disagrees with a constant here.

A node program (``_blockdev``, ``_systemd``, ...) imports this file too, so it ships beside
them: in roles/launch_wrapper/vars/main.yml ``__launch_wrapper_programs`` and in the node files
of the modules (``_readahead.NODE_FILES``); tests/unit/plugins/module_utils/test_node_programs.py
checks both lists. No imports: this file must run on a bare node python3.
"""

from __future__ import annotations

# Records the collection keeps across reboots (readahead windows, sysctl originals, launches).
STATE_DIR = "/var/lib/uma-vllm"
# The node-side programs (launcher, guard, readahead restorer, watchdog).
LIB_DIR = "/usr/local/lib/uma-vllm"
# Node configuration (launch.json, engines/, watchdog/).
CONFIG_DIR = "/etc/uma-vllm"
# Runtime files (locks, status files); tmpfs, gone at boot.
RUN_DIR = "/run/uma-vllm"
# The python3 the node programs run with.
PYTHON = "/usr/bin/python3"
# An engine's name: it becomes part of unit names, file names and container names.
ENGINE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# The vLLM release the roles and the lab image are pinned to.
VLLM_VERSION = "0.32.0"
