# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node programs: what runs on a node under systemd with its python3 and no Ansible.

Standard library only, imported one way (relative imports inside this package), so the package runs
the same from the collection (``ansible_collections...module_utils.node``) and from the node, where
``uma.vllm.node_files`` installs it whole as ``<lib_dir>/uma_vllm_node/`` beside one entry script per
program (``plumbing/node_install.py``: the one list of what ships, and the entry scripts).
Nothing here imports controller code (``plan``, ``service``, ``diagnose``, ``models``, ``system``,
``plumbing``); a program imports no other program, only its own parts and ``base``.

- ``base``: what every program shares (files and records, paths, systemd, metrics, memory rules)
- ``launch``: the launcher (``uma_launch.py`` on the node)
- ``guard``: the page-cache guard (``uma_guard.py``)
- ``watchdog``: the engine watchdog (``uma_watchdog.py``)
- ``cluster``: the rank link of a multi-node engine and its HMAC
"""

# The directory the package is installed as, inside lib_dir (the entry scripts import it by this name).
PACKAGE_DIR = "uma_vllm_node"
# The programs the units run: lib_dir/<name> -> the module of this package whose main() it calls.
ENTRY_SCRIPTS = (
    ("uma_launch.py", "launch.program", "the node-local vLLM launcher"),
    ("uma_guard.py", "guard.program", "the page-cache guard"),
    ("uma_watchdog.py", "watchdog.program", "the engine watchdog"),
    ("uma_readahead.py", "base.blockdev", "the readahead restorer"),
    ("uma_metrics.py", "base.metrics", "the textfile collector of the monitoring role"),
)
ENTRY_TEMPLATE = """# -*- coding: utf-8 -*-
# uma.vllm: %(what)s (installed by uma.vllm.node_files; do not edit).
# The code is the package beside this file: %(package)s/%(path)s.py
import sys

from %(package)s.%(module)s import main

sys.exit(main())
"""


def entry_script(module: str, what: str) -> str:
    """The text of one entry script (it imports the package from its own directory: sys.path[0])."""
    return ENTRY_TEMPLATE % {"what": what, "package": PACKAGE_DIR, "path": module.replace(".", "/"), "module": module}
