# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers shared by the unit tests of the node programs (no tests here).

- ``flat_copy``: the node package and its entry scripts in one lib directory, installed by the
  collection's own installer as uma.vllm.node_files installs them (``plumbing/node_install.py``),
  to run with ``python3 -S lib/uma_launch.py`` and no Ansible.
- ``NODE_LIB``: one such directory for this test process (the programs as a node runs them).
- ``watchdog_config``: a watchdog config file whose every path is under ``tmp_path``.
- ``launch_config``: a validated launcher config whose every path is under ``tmp_path``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile

from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch
from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install

# the node's python3 without the venv's site-packages: the programs must need the stdlib only
NODE_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
MEMINFO_24G = "MemTotal: 25165824 kB\nMemFree: 1048576 kB\nMemAvailable: 16777216 kB\n"


def install_node_lib(lib):
    """Install the node package and its entry scripts into ``lib`` (a str or path) with the collection's
    own installer, as uma.vllm.node_files does on a node; returns ``lib``."""
    node_install.install_node_files(node_install.plan_node_files(str(lib)))
    return lib


def flat_copy(tmp_path):
    """``tmp_path/lib`` with the node package and its entry scripts, the set the roles install on a node."""
    lib = tmp_path / "lib"
    lib.mkdir()
    return install_node_lib(lib)


# One installed lib_dir for this test process: the harnesses run the programs from it
# (``os.path.join(NODE_LIB, "uma_launch.py")``), as a node's units do.
NODE_LIB = install_node_lib(tempfile.mkdtemp(prefix="uma-node-lib-"))
os.chmod(NODE_LIB, 0o755)  # as a node's lib_dir (mkdtemp makes it 0700): readable by an engine user too
# gone when this test process ends (not when a child forked from it does)
_OWNER = os.getpid()
atexit.register(lambda: os.getpid() == _OWNER and shutil.rmtree(NODE_LIB, True))


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
