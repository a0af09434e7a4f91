# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Install node-side programs from the collection's own module_utils sources.

The guard and the readahead restorer run on the node long after the Ansible
connection is gone, under systemd. The module that starts them first copies
their source (and the sibling modules they import, such as ``_common``) into
``lib_dir``. The source comes from the loaded Python module itself, so it is
exactly the code the module was shipped with: a plain file in a checkout, or a
member of the AnsiballZ zip on the node (``zipimporter.get_source``).

A file is rewritten only when its content differs (atomically, mode 0644), so a
second run reports no change.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

try:
    from ansible_collections.uma.vllm.plugins.module_utils._common import UmaError, atomic_write, read_text
except ImportError:  # pragma: no cover - node-side use without Ansible
    from _common import UmaError, atomic_write, read_text  # type: ignore[no-redef]


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


def plan_node_files(modules: Sequence[ModuleType], lib_dir: str) -> List[NodeFile]:
    """What installing ``modules`` into ``lib_dir`` would change; touches nothing."""
    if not lib_dir or not os.path.isabs(lib_dir):
        raise UmaError("lib_dir", lib_dir, "is not an absolute directory path", "Give e.g. /usr/local/lib/uma-vllm.")
    if os.path.exists(lib_dir) and not os.path.isdir(lib_dir):
        raise UmaError("lib_dir", lib_dir, "exists and is not a directory", "Remove the file or choose another path.")
    files = []
    for mod in modules:
        name = mod.__name__.rpartition(".")[2] + ".py"
        path = os.path.join(lib_dir, name)
        try:
            before = read_text(path)
        except (OSError, UnicodeDecodeError):
            before = ""  # unreadable or not text: rewrite it
        files.append(NodeFile(name=name, path=path, content=module_source(mod), before=before))
    return files


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
