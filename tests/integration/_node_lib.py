# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node programs as a node runs them, for the integration tests (no tests here).

``NODE_LIB`` is one lib_dir for this test process with the node package and its entry scripts,
installed by the collection's own installer (``plumbing/node_install.py``, what uma.vllm.node_files
does on a node); ``program("uma_launch.py")`` is the path a unit runs.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install

NODE_LIB = tempfile.mkdtemp(prefix="uma-node-lib-")
os.chmod(NODE_LIB, 0o755)  # as a node's lib_dir: the tests that run a program as another user read it too
# gone when this test process ends (not when a child forked from it does)
_OWNER = os.getpid()
atexit.register(lambda: os.getpid() == _OWNER and shutil.rmtree(NODE_LIB, True))
node_install.install_node_files(node_install.plan_node_files(NODE_LIB))


def program(name: str) -> str:
    """The installed entry script ``name`` (``uma_launch.py``, ``uma_guard.py``, ...)."""
    path = os.path.join(NODE_LIB, name)
    assert os.path.isfile(path), "no entry script %s in the installed node lib" % name
    return path
