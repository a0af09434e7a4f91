# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every shell script the README and docs tell a person to run is executable in a fresh clone.

``lab/vm.sh up`` (docs/VM-LAB.md) was committed without its executable bit: from a fresh clone it
answered "Permission denied" (found on 26 Nov 2026 when a script called it directly). Git keeps the
mode, so the index is the truth a clone gets.
"""

from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def tracked_scripts():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-s", "--", "*.sh"], capture_output=True, text=True,
                             check=True, timeout=60).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.fail("git ls-files failed in %s: %s" % (ROOT, err))
    rows = [line.split(None, 3) for line in out.splitlines() if line.strip()]
    return [(mode, path) for mode, _sha, _stage, path in rows]


def test_every_tracked_shell_script_is_executable():
    scripts = tracked_scripts()
    assert any(path == "lab/vm.sh" for _mode, path in scripts), scripts
    assert [path for mode, path in scripts if mode != "100755"] == []
