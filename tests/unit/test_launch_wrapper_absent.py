"""launch_wrapper state=absent removes only what it owns (issue 13 item 4).

The lib dir is shared: readahead_window's boot unit and the timer of an open window run
uma_readahead.py (and the node package) from it, and monitoring keeps its collector in
lib_dir/monitoring. Before the fix
the role deleted the whole directory. Each case runs the real role (ansible-playbook, local
connection) on directories under tmp_path; the real systemd is not touched (the boot unit is a
file the role reads). The proof on a systemd node is molecule/launch_wrapper/cleanup.yml.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install as _node_programs

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESTORER = ["uma_readahead.py", "uma_vllm_node"]


CASES = {
    "alone": {},
    "boot_unit": {"boot_unit": True},
    "record": {"record": True},
    "monitoring": {"monitoring": True},
    "other_lib": {"other_lib": "/usr/local/lib/uma-vllm-x"},
    "legacy": {"legacy": True},
    "legacy_boot_unit": {"legacy": True, "legacy_boot_unit": True},
}
# the flat files a version before the node package installed (roles/launch_wrapper/vars/main.yml)
LEGACY = ["_common.py", "_paths.py", "_blockdev.py", "_guard_config.py", "_launch_node.py", "_watchdog_logic.py"]


def node(base, boot_unit=False, record=False, monitoring=False, other_lib=None, legacy=False, legacy_boot_unit=False):
    """A node after launch_wrapper (and maybe readahead_window / monitoring) installed their files."""
    lib, state, etc, units = (base / d for d in ("lib", "state", "etc", "units"))
    for directory in (lib, state / "launches" / "a", etc / "engines", units):
        directory.mkdir(parents=True)
    # what uma.vllm.node_files installs (programs: true): the node package and its entry scripts
    _node_programs.install_node_files(_node_programs.plan_node_files(str(lib)))
    (lib / "__pycache__").mkdir()
    (base / "vllm-uma-launch").write_text("#!/bin/sh\n")
    (etc / "launch.json").write_text("{}\n")
    (etc / "engines" / "a.json").write_text("{}\n")
    if boot_unit or other_lib:
        unit = _blockdev.render_boot_unit(_paths.PYTHON, other_lib or str(lib), str(state))
        (units / _blockdev.BOOT_UNIT).write_text(unit)
    if record:
        (state / "readahead-w.json").write_text(json.dumps({"version": 1, "name": "w", "devices": []}))
    for name in LEGACY if legacy else []:
        (lib / name).write_text("# %s of an earlier version\n" % name)
    if legacy_boot_unit:  # the boot unit an earlier readahead_window wrote: it runs lib/_blockdev.py
        (units / _blockdev.BOOT_UNIT).write_text(
            "[Service]\nExecStart=%s %s/_blockdev.py restore --all\n" % (_paths.PYTHON, lib)
        )
    if monitoring:
        (lib / "monitoring").mkdir()
        (lib / "monitoring" / "uma_metrics.py").write_text("# monitoring's collector\n")


@pytest.fixture(scope="module")
def removed(tmp_path_factory):
    """Every case a host of one play (local connection): launch_wrapper with state=absent."""
    tmp = tmp_path_factory.mktemp("lw-absent")
    inventory = {}
    for case, kind in CASES.items():
        base = tmp / case
        node(base, **kind)
        inventory[case] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "launch_wrapper_lib_dir": str(base / "lib"),
            "launch_wrapper_state_dir": str(base / "state"),
            "launch_wrapper_config_dir": str(base / "etc"),
            "launch_wrapper_bin": str(base / "vllm-uma-launch"),
        }
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": inventory}}))
    play = [{"hosts": "all", "gather_facts": False,
             "roles": [{"role": "uma.vllm.launch_wrapper", "launch_wrapper_state": "absent"}]}]  # fmt: skip
    # a role var: only extra vars beat it; a template, so each host reads its own boot unit
    unit = {"__launch_wrapper_readahead_boot_unit": "%s/{{ inventory_hostname }}/units/%s" % (tmp, _blockdev.BOOT_UNIT)}
    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(tmp / "inventory.yml"),
         str(tmp / "play.yml"), "-e", json.dumps(unit)],
        capture_output=True, text=True, cwd=tmp, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return tmp


def left(base):
    """What the role left in the lib dir (None: the dir is gone); its own files are gone in every case."""
    assert not (base / "vllm-uma-launch").exists()
    assert not (base / "etc" / "launch.json").exists() and not (base / "etc" / "engines").exists()
    assert not (base / "state" / "launches").exists()
    lib = base / "lib"
    return sorted(p.name for p in lib.iterdir()) if lib.exists() else None


def test_alone_it_removes_the_whole_lib_dir(removed):
    assert left(removed / "alone") is None


def test_the_readahead_boot_units_restorer_is_kept_and_still_runs(removed):
    base = removed / "boot_unit"
    assert left(base) == RESTORER
    # the boot unit's command, with the files that are left and no Ansible on the path
    ran = subprocess.run(
        [sys.executable, "-S", str(base / "lib" / "uma_readahead.py"), "restore", "--all",
         "--state-dir", str(base / "state")],
        capture_output=True, text=True, cwd=base, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["results"] == []


def test_an_open_windows_record_keeps_the_restorer(removed):
    assert left(removed / "record") == RESTORER


def test_monitorings_collector_keeps_its_directory(removed):
    assert left(removed / "monitoring") == ["monitoring"]
    assert (removed / "monitoring" / "lib" / "monitoring" / "uma_metrics.py").exists()


def test_a_boot_unit_for_another_lib_dir_keeps_nothing(removed):
    assert left(removed / "other_lib") is None


def test_an_earlier_versions_flat_files_are_removed_too(removed):
    """Upgraded nodes keep the flat files of the versions before the node package: absent removes them."""
    assert left(removed / "legacy") is None


def test_an_earlier_readahead_boot_unit_keeps_its_restorer(removed):
    """A boot unit an earlier readahead_window wrote runs lib/_blockdev.py (with _common.py, _paths.py)."""
    assert left(removed / "legacy_boot_unit") == ["_blockdev.py", "_common.py", "_paths.py"]
