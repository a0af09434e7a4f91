# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node package as it ships: the one list of its modules, where each lands, the entry scripts.

The launcher, the page-cache guard, the engine watchdog and the readahead restorer run on the node
long after the Ansible connection is gone, under systemd, with the node's python3 and no Ansible.
Their code is the package ``module_utils/node``; a module that installs them (``node_files`` with
``programs: true``, ``drop_cache_loop``, ``readahead_window``) writes the whole package into
``<lib_dir>/uma_vllm_node/`` and one small entry script per program into ``lib_dir``
(``uma_launch.py``, ``uma_guard.py``, ``uma_watchdog.py``, ``uma_readahead.py``: the paths the units
run). Inside the package every import is relative, so it runs under that name as it runs here.

:data:`NODE_MODULES` is the one list of what ships. Its imports are static on purpose: AnsiballZ
ships exactly the module_utils a module imports, so every module that imports this file carries
the whole package in its payload, and the source is read from there (``module_source``: a plain
file in a checkout, a member of the AnsiballZ zip on the node). tests/unit/plugins/module_utils/
test_node_programs.py checks that the list is every file of the package, nothing missing or extra.

A file is rewritten only when its content differs (atomically, mode 0644), so a second run reports
no change.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.uma.vllm.plugins.module_utils import node
from ansible_collections.uma.vllm.plugins.module_utils.node import base, cluster, guard, launch, watchdog
from ansible_collections.uma.vllm.plugins.module_utils.node.base import (
    blockdev,
    checks,
    common,
    memavail,
    metrics,
    paths,
    plan,
    stopper,
    systemd,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, atomic_write, read_text
from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import link_auth, ranks
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import (
    config as guard_config,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import (
    memory as guard_memory,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import (
    program as guard_program,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import (
    residency as guard_residency,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import (
    status as guard_status,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import (
    sweeper as guard_sweeper,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import (
    watch as guard_watch,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import (
    admission as launch_admission,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import (
    config as launch_config,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import (
    node as launch_node,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import (
    program as launch_program,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import (
    shm as launch_shm,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import (
    counters as watchdog_counters,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import (
    logic as watchdog_logic,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import (
    probes as watchdog_probes,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import (
    program as watchdog_program,
)

PACKAGE_DIR = node.PACKAGE_DIR
# The one list of what ships to a node: every module of the package (the packages' __init__ too).
NODE_MODULES = (
    node,
    base,
    blockdev,
    checks,
    common,
    memavail,
    metrics,
    paths,
    plan,
    stopper,
    systemd,
    cluster,
    link_auth,
    ranks,
    guard,
    guard_config,
    guard_memory,
    guard_program,
    guard_residency,
    guard_status,
    guard_sweeper,
    guard_watch,
    launch,
    launch_admission,
    launch_config,
    launch_node,
    launch_program,
    launch_shm,
    watchdog,
    watchdog_counters,
    watchdog_logic,
    watchdog_probes,
    watchdog_program,
)


def module_source(mod: ModuleType) -> str:
    """The source text of a loaded module (file, zip member or anything with a loader)."""
    short = mod.__name__.rpartition(".")[2]
    loader = getattr(mod, "__loader__", None)
    source: Optional[str] = None
    if loader is not None and hasattr(loader, "get_source"):
        try:
            source = loader.get_source(mod.__name__)
        except (ImportError, OSError):
            source = None
        if isinstance(source, bytes):  # ansible-core's collection loader on the controller gives bytes
            source = source.decode("utf-8")
    if source is None:
        path = getattr(mod, "__file__", None)
        if path and path.endswith(".py"):
            source = read_text(path)
    if source is None:
        raise UmaError(
            "lib_dir",
            short,
            "the source of this node-side program could not be read from the module payload",
            "Install the collection from a source tree or a Galaxy tarball (not a byte-compiled copy).",
        )
    return source


def relative_name(mod: ModuleType) -> str:
    """The module's dotted name inside the node package ('' for the package itself)."""
    prefix = node.__name__
    if mod.__name__ == prefix:
        return ""
    if not mod.__name__.startswith(prefix + "."):
        raise ValueError("%s is not a module of the node package %s" % (mod.__name__, prefix))
    return mod.__name__[len(prefix) + 1 :]


def relative_path(mod: ModuleType) -> str:
    """Where the module lands under lib_dir (``uma_vllm_node/guard/program.py``, ``.../__init__.py``)."""
    parts = [PACKAGE_DIR, *filter(None, relative_name(mod).split("."))]
    if hasattr(mod, "__path__"):
        parts.append("__init__.py")
    else:
        parts[-1] += ".py"
    return "/".join(parts)


def node_sources() -> List[Tuple[str, str]]:
    """(path under lib_dir, text) of everything that ships: the package, then the entry scripts."""
    files = [(relative_path(mod), module_source(mod)) for mod in NODE_MODULES]
    files.extend((name, node.entry_script(module, what)) for name, module, what in node.ENTRY_SCRIPTS)
    return files


def program_names() -> List[str]:
    """The paths under lib_dir of everything that ships, in order (what node_files reports)."""
    return [name for name, _text in node_sources()]


def package_dirs(lib_dir: str) -> List[str]:
    """The package's directories under lib_dir, parents first."""
    dirs = {os.path.dirname(path) for path, _text in node_sources()}
    return [os.path.join(lib_dir, d) for d in sorted(d for d in dirs if d)]


def sha256(text: Optional[str]) -> Optional[str]:
    if text is None:
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class NodeFile:
    name: str
    path: str
    content: str
    before: Optional[str]

    @property
    def changed(self) -> bool:
        return self.before != self.content

    def summary(self) -> Dict[str, Any]:
        return {
            "path": self.path,
            "changed": self.changed,
            "sha256": sha256(self.content),
            "sha256_before": sha256(self.before),
        }


def plan_node_files(lib_dir: str) -> List[NodeFile]:
    """What installing the node package (and its entry scripts) into ``lib_dir`` would change; touches nothing."""
    if not lib_dir or not os.path.isabs(lib_dir):
        raise UmaError("lib_dir", lib_dir, "is not an absolute directory path", "Give e.g. /usr/local/lib/uma-vllm.")
    if os.path.exists(lib_dir) and not os.path.isdir(lib_dir):
        raise UmaError("lib_dir", lib_dir, "exists and is not a directory", "Remove the file or choose another path.")
    files = []
    for name, content in node_sources():
        path = os.path.join(lib_dir, name)
        try:
            before = read_text(path)
        except (OSError, UnicodeDecodeError):
            before = ""  # missing, unreadable or not text: rewrite it
        files.append(NodeFile(name=name, path=path, content=content, before=before))
    return files


def programs_fingerprint() -> str:
    """One fingerprint over what ships (what node_files reports after installing it)."""
    return files_fingerprint([NodeFile(name=name, path="", content=text, before=None) for name, text in node_sources()])


def install_node_files(files: Sequence[NodeFile]) -> List[str]:
    """Write the files that differ; returns their paths."""
    written = []
    for item in files:
        if not item.changed:
            continue
        try:
            os.makedirs(os.path.dirname(item.path), mode=0o755, exist_ok=True)
            atomic_write(item.path, item.content, 0o644)
        except OSError as err:
            raise UmaError(
                "lib_dir",
                os.path.dirname(item.path),
                "could not be written (%s: %s)" % (err.filename or item.path, err.strerror),
                "Run with become: true or choose a writable lib_dir.",
            ) from None
        written.append(item.path)
    return written


def files_fingerprint(files: Sequence[NodeFile]) -> str:
    """One fingerprint over the installed programs (so a new program version restarts a service)."""
    digest = hashlib.sha256()
    for item in sorted(files, key=lambda f: f.name):
        digest.update(item.name.encode("utf-8") + b"\0" + item.content.encode("utf-8") + b"\0")
    return digest.hexdigest()[:16]
