# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which of the packages a role installs are already on a Debian/Ubuntu node, from dpkg's own status file.

``uma.vllm.node_facts`` reads it so that ``node_prep`` runs its package task only where something is
missing: the apt module costs about a second per run even when it changes nothing (a no-op re-run
of site.yml, issue 34 item 7). Only a plain package name can be decided here; a name with a version
(``foo=1.2``), an architecture (``foo:arm64``), a wildcard or a release (``foo/noble``) is reported
missing, so that the package manager decides as before.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, List, Optional, Set

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError

DPKG_STATUS = "/var/lib/dpkg/status"
_PLAIN_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
# what dpkg writes for a package that is installed and configured: want, error flag, state
_INSTALLED = {"ok installed"}


def check_names(option: str, names: Any) -> List[str]:
    """The ``packages`` option: a list of non-empty names without NUL, blanks or line breaks (refused naming
    the option, the value and the fix; the module fails with it)."""
    if not isinstance(names, list):
        raise UmaError(option, names, "is not a list of package names", "Give e.g. [python3-psutil].")
    for index, name in enumerate(names):
        if not isinstance(name, str) or not name or any(c in name for c in "\x00\n\r\t "):
            raise UmaError(
                "%s[%d]" % (option, index),
                name,
                "is not a package name",
                "Give a name as apt takes it, e.g. python3-psutil.",
            )
    return names


def installed(status_text: str) -> Set[str]:
    """The names of the packages dpkg's status text marks installed (``Status: <want> ok installed``)."""
    names: Set[str] = set()
    for stanza in re.split(r"\n\s*\n", status_text):
        name = status = None
        for line in stanza.splitlines():
            if line.startswith("Package:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Status:"):
                words = line.split(":", 1)[1].split()
                status = " ".join(words[1:3]) if len(words) == 3 else None
        if name and status in _INSTALLED:
            names.add(name)
    return names


def missing(packages: Iterable[str], status_text: Optional[str]) -> Optional[List[str]]:
    """The packages of ``packages`` that are not installed, in their order; None when there is no
    status text to read (not a dpkg node: the package manager decides)."""
    if status_text is None:
        return None
    have = installed(status_text)
    return [name for name in packages if not (_PLAIN_NAME.match(name) and name in have)]
