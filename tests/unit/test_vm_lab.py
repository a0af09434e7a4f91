"""The VM lab node's host-side pieces that run without a VM (issue 20 items 1-2).

Booting the VM (TCG, ~30 s plus a lock shared with other heavy runs) is not part of the unit
stage; docs/VM-LAB.md has the measured runs. Here: lab/vm.sh refuses bad settings before it
does anything (checked on `status`, which builds nothing either way), `status`/`down` are safe
when nothing runs, and the ioctl ABI of lab/vm/fakegb10_alloc.py (Python) matches
fakegb10_uapi.h (C, compiled by the host's gcc).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1].parent
VM_SH = ROOT / "lab" / "vm.sh"
UAPI = ROOT / "lab" / "vm" / "fakegb10" / "fakegb10_uapi.h"


def run_vm(tmp_path, *args, **env):
    full = dict(os.environ, UMA_VM_CACHE=str(tmp_path / "cache"), UMA_VM_LOCK=str(tmp_path / "lock"), **env)
    cmd = ["bash", str(VM_SH), *args]
    return subprocess.run(cmd, check=False, env=full, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "var, value",
    [
        ("UMA_VM_MEM_MIB", "3G"),
        ("UMA_VM_CPUS", "-1"),
        ("UMA_VM_SSH_PORT", "22;rm"),
        ("UMA_VM_ACCEL", "hvf"),
        ("UMA_VM_MODEL_GIB", "lots"),
    ],
)
def test_bad_setting_refused_before_anything(tmp_path, var, value):
    # `status` (not `up`): were the check missing, this must not start a build.
    res = run_vm(tmp_path, "status", **{var: value})
    assert res.returncode == 1, res
    assert var in res.stderr and value in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "cache").exists(), "nothing is built for a refused setting"


def test_status_and_down_when_stopped(tmp_path):
    res = run_vm(tmp_path, "status")
    assert res.returncode == 3 and res.stdout.strip() == "stopped"
    res = run_vm(tmp_path, "down")
    assert res.returncode == 0 and "not running" in res.stderr


def test_unknown_command(tmp_path):
    res = run_vm(tmp_path, "reboot")
    assert res.returncode == 2 and "usage" in res.stderr


def load_alloc_tool():
    spec = importlib.util.spec_from_file_location("fakegb10_alloc", ROOT / "lab" / "vm" / "fakegb10_alloc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs the host's gcc to compile the C header")
def test_ioctl_abi_matches_header(tmp_path):
    prog = tmp_path / "abi.c"
    prog.write_text(
        f'#include <stdio.h>\n#include <stddef.h>\n#include "{UAPI}"\n'
        "int main(void) {\n"
        '  printf("%lu %lu %u %lu %lu\\n", (unsigned long)FAKEGB10_IOC_ALLOC, sizeof(struct fakegb10_alloc),\n'
        "         FAKEGB10_MMAP_SHIFT, offsetof(struct fakegb10_alloc, page_size),\n"
        "         offsetof(struct fakegb10_alloc, mmap_offset));\n"
        "  return 0;\n}\n"
    )
    subprocess.run(["gcc", "-o", str(tmp_path / "abi"), str(prog)], check=True, timeout=60)
    ioc, size, shift, off_page, off_mmap = map(int, subprocess.check_output([str(tmp_path / "abi")]).split())
    tool = load_alloc_tool()
    assert tool.IOC_ALLOC == ioc
    assert tool.ALLOC_SIZE == size == 32
    assert (off_page, off_mmap) == (16, 24)
    assert shift == 40


def test_the_vm_inventory_is_the_collections_own_shape():
    """inventories/vm (site.yml on the VM lab node, uma_vm.py --configs c): the host reached over the loopback
    port lab/vm.sh forwards, the reserve the Spark rule's value scaled to the
    guest (the literal in group_vars is node_prep's rule for 121 GiB, checked here against the rule itself), and
    one engine: the loader as rank 0 of two, planned from the weights uma_vm.py measures."""
    import yaml

    from ansible_collections.uma.vllm.plugins.module_utils.system import sysctl as _sysctl

    group = yaml.safe_load((ROOT / "inventories" / "vm" / "group_vars" / "uma_vm.yml").read_text())
    spark = _sysctl.size_min_free_kbytes(121 * 1024**3)["min_free_kbytes"]
    assert group["uma_min_free_kbytes"].startswith("{{ (%d * " % spark), group["uma_min_free_kbytes"]
    assert group["ansible_host"] == "127.0.0.1" and "UMA_VM_SSH_PORT" in group["ansible_port"]
    (engine,) = group["vllm_service_engines"]
    assert engine["command"][1] == "/root/uma_loader.py" and engine["command"][2:4] == ["--as-rank", "2:0"]
    assert engine["plan"]["weights_bytes"] == "{{ uma_vm_weights_bytes }}" and engine["plan"]["kv_budget"] == "max"
    hosts = yaml.safe_load((ROOT / "inventories" / "vm" / "hosts.yml").read_text())
    assert list(hosts["all"]["children"]["uma_vm"]["hosts"]) == ["uma-vm"]
