# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Builds the sysfs trees of tests/unit/fixtures/rdma under a temporary directory.

Each fixture is a directory with ``sys.tree`` (the sysfs tree as a listing: ``<path> = <content>``
for a file, ``<path> -> <target>`` for a symbolic link, ``#`` comments) and ``proc/`` (copied as it
is). The listing exists because ansible-test sanity refuses ':' in file names and links to
directories, and a real sysfs is made of both.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, Dict, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.system import rdma

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "rdma")
SPARK = "dgx-spark-pair-node1"
RXE = "soft-roce-rxe0"


def build_tree(listing: str, root: str, keep: Optional[Callable[[str], bool]] = None) -> None:
    """Make the files and links of a ``sys.tree`` listing under ``root`` (the lines ``keep`` keeps)."""
    made = set()
    for number, line in enumerate(listing.splitlines(), 1):
        if not line.strip() or line.startswith("#") or (keep and not keep(line)):
            continue
        path, _sep, rest = line.partition(" ")
        full = os.path.join(root, path)
        parent = os.path.dirname(full)
        if parent not in made:  # the harness builds this tree a thousand times
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        if rest.startswith("= "):
            with open(full, "w", encoding="utf-8") as handle:
                handle.write(rest[2:] + "\n")
        elif rest.startswith("-> "):
            os.symlink(rest[3:], full)
        else:
            raise ValueError("sys.tree line %d is neither '<path> = <content>' nor '<path> -> <target>'" % number)


def build(name: str, dest: str, keep: Optional[Callable[[str], bool]] = None) -> Tuple[str, str]:
    """Fixture ``name`` under ``dest``: returns (sysfs_root, proc_root)."""
    source = os.path.join(FIXTURES, name)
    sysfs_root = os.path.join(dest, "sys")
    proc_root = os.path.join(dest, "proc")
    with open(os.path.join(source, "sys.tree"), encoding="utf-8") as handle:
        build_tree(handle.read(), sysfs_root, keep)
    shutil.copytree(os.path.join(source, "proc"), proc_root)
    return sysfs_root, proc_root


def spark_halves(line: str) -> bool:
    """The Spark tree with only the port that has the cable (its two halves), without the empty GID
    entries: what the bad-input harness builds a thousand times."""
    return "s0f0" not in line and "enP7s7" not in line and not line.endswith(" = " + ":".join(["0000"] * 8))


def facts(sysfs_root: str, proc_root: str, cluster_addr: Optional[str] = None) -> Dict[str, Any]:
    """What rdma_facts returns for a built tree (checked to be plain JSON, as the module's result)."""
    result = rdma.rdma_facts(
        rdma.check_request({"sysfs_root": sysfs_root, "proc_root": proc_root, "cluster_addr": cluster_addr})
    )
    json.dumps(result, allow_nan=False)  # what the module returns must be plain JSON
    return result
