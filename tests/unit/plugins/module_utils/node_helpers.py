# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers shared by the unit tests of the node programs (no tests here).

- ``flat_copy``: the node programs in one flat directory, as uma.vllm.node_files installs them
  (``_node_programs.NODE_PROGRAMS``), to run with ``python3 -S FILE`` and no Ansible.
- ``watchdog_config``: a watchdog config file whose every path is under ``tmp_path``.
- ``launch_config``: a validated launcher config whose every path is under ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from ansible_collections.uma.vllm.plugins.module_utils import _node_programs, uma_launch

MODULE_UTILS = os.path.dirname(os.path.abspath(uma_launch.__file__))
# the node's python3 without the venv's site-packages: the programs must need the stdlib only
NODE_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
MEMINFO_24G = "MemTotal: 25165824 kB\nMemFree: 1048576 kB\nMemAvailable: 16777216 kB\n"


def flat_copy(tmp_path):
    """``tmp_path/lib`` with every node program, the set the roles install on a node."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in _node_programs.program_names():
        shutil.copy(os.path.join(MODULE_UTILS, name), str(lib / name))
    return lib


def watchdog_config(tmp_path, state_dir, textfile_dir=None, **extra):
    """The path of a watchdog config under tmp_path (systemctl: /bin/false, no engine on port 9).

    No systemd here: the unit reads as unknown and the watchdog only watches.
    """
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "meminfo").write_text(MEMINFO_24G)
    raw = {
        "engine": "main",
        "base_url": "http://127.0.0.1:9",
        "systemctl": "/bin/false",
        "meminfo_root": str(proc),
        "cgroup_root": str(tmp_path / "no-cgroup"),
        "state_dir": str(state_dir),
        "textfile_dir": str(textfile_dir) if textfile_dir else None,
        **extra,
    }
    path = tmp_path / "watchdog.json"
    path.write_text(json.dumps(raw))
    return path


def launch_config(tmp_path, meminfo, **extra):
    """A validated launcher config for engine e1 (``true`` as the engine, nothing on the health port).

    ``meminfo`` is written as ``tmp_path/proc/meminfo``; ``extra`` adds or replaces keys
    (state_dir, lock_path, plan, ...).
    """
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "meminfo").write_text(meminfo)
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    raw = {
        "engine": "e1",
        "command": ["true"],
        "health_url": "http://127.0.0.1:1/health",
        "model_path": str(model),
        "state_dir": str(tmp_path / "state"),
        "lock_path": str(tmp_path / "lock"),
        "proc_root": str(proc),
        **extra,
    }
    return uma_launch.validate(uma_launch.merge_config(raw))
