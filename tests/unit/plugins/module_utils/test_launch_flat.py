"""The launcher runs from the lib directory the launch_wrapper role installs, as on a node.

uma.vllm.node_files (``programs: true``, the role's install task) installs the node package
(``plumbing/node_install.py`` NODE_MODULES) as ``lib/uma_vllm_node/`` with its entry scripts, and
systemd runs ``python3 lib/uma_launch.py`` there, without Ansible. test_node_programs checks the
package's imports statically; this runs the installed set with ``python3 -S`` (no site-packages,
so no ``ansible_collections``) and a bad configuration, which must be refused with exit 78 and the
option named, not a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys

import node_helpers

from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch


def run_flat(lib, *args):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}  # no PYTHONPATH
    return subprocess.run(
        [sys.executable, "-S", str(lib / "uma_launch.py"), *args],
        cwd="/", env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_installed_set_imports_and_refuses_a_bad_config_with_78(tmp_path):
    lib = node_helpers.flat_copy(tmp_path)
    proc = run_flat(
        lib, "--engine", "flat", "--node-config", "/nonexistent", "--health-url", "http://127.0.0.1:1/health",
        "--model-path", str(tmp_path / "absent"), "--", "true",
    )  # fmt: skip
    assert proc.returncode == uma_launch.EXIT_CONFIG == 78, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "option 'model_path'" in proc.stderr and "does not exist on this node" in proc.stderr


def test_the_installed_set_prints_its_help(tmp_path):
    proc = run_flat(node_helpers.flat_copy(tmp_path), "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: vllm-uma-launch")


def test_a_missing_part_fails_on_the_node(tmp_path):
    """The check can fail: without launch/node.py the launcher cannot start."""
    lib = node_helpers.flat_copy(tmp_path)
    os.unlink(str(lib / "uma_vllm_node" / "launch" / "node.py"))
    proc = run_flat(lib, "--help")
    assert proc.returncode != 0
    assert "cannot import name 'node' from 'uma_vllm_node.launch'" in proc.stderr
