#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_facts
short_description: Tell whether a node is a unified-memory machine (GB10, GH200, GB200, Jetson Thor)
version_added: 0.1.0
description:
  - Reads the markers of NVIDIA unified-memory platforms and sets the fact C(uma_node).
  - Markers are C(nvidia-smi) GPU names and framebuffer size (a GPU with no framebuffer
    size uses system memory), the device tree (C(nvidia,tegra264), Jetson models),
    C(/etc/nv_tegra_release), the DMI product name, and C(lscpu) (a CPU hint only).
  - Never fails on a host without a GPU or without C(nvidia-smi); it says so in the evidence.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
  facts:
    support: full
    description: Sets the fact C(uma_node).
options:
  sysfs_root:
    description: Root of sysfs (device tree, DMI); tests point it at a temporary tree.
    type: path
    default: /sys
  proc_root:
    description: Root of procfs (C(meminfo), device tree).
    type: path
    default: /proc
  nvidia_smi:
    description: The C(nvidia-smi) command to query; looked up in C(PATH) when not absolute.
    type: str
    default: nvidia-smi
  lscpu:
    description: The C(lscpu) command.
    type: str
    default: lscpu
  packages:
    description:
      - Packages to look for in dpkg's status file (C(dpkg_status)); the fact's C(packages_missing) lists
        those not installed, so that a role installs packages only where one is missing.
      - A name with a version, an architecture, a wildcard or a release (C(foo=1.2), C(foo:arm64)) is
        always reported missing (the package manager decides).
    type: list
    elements: str
    default: []
  dpkg_status:
    description: dpkg's status file; where it cannot be read C(packages_missing) is null (not a dpkg node).
    type: path
    default: /var/lib/dpkg/status
"""

EXAMPLES = r"""
- name: Find out what kind of node this is
  uma.vllm.node_facts:

- name: Say it (the fact is in ansible_facts, whatever inject_facts_as_vars is)
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }}: unified memory {{ node.unified_memory }} ({{ node.reason }})"
  vars:
    node: "{{ ansible_facts.uma_node }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host.
  returned: always
  type: complex
  contains:
    uma_node:
      description: The classification and its evidence; C(packages_missing) lists the C(packages) not installed
        (null where dpkg's status cannot be read, empty without C(packages)).
      returned: always
      type: dict
      sample:
        unified_memory: true
        platform: gb10
        platform_description: NVIDIA GB10 (DGX Spark class), unified LPDDR5X
        cpu_hint: gb10
        gpus: [{"name": "NVIDIA GB10", "memory_total": "[N/A]", "memory_total_mib": null, "unified": true}]
        gpu_present: true
        cpu_model: Cortex-X925
        architecture: aarch64
        ram_gib: 119.7
        packages_missing: []
        reason: "unified-memory markers: gb10"
        evidence: ["nvidia-smi: GPU 'NVIDIA GB10' is a NVIDIA GB10 (DGX Spark class), unified LPDDR5X"]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, check_path, read_meminfo
from ansible_collections.uma.vllm.plugins.module_utils.system import packages as _packages
from ansible_collections.uma.vllm.plugins.module_utils.system.platform import (
    classify,
    gather_files,
    parse_lscpu,
    parse_nvidia_smi_csv,
)


def _run(module: AnsibleModule, command: str, args: list) -> tuple:
    """(stdout, error) without failing when the command is missing or errors.

    A host without the tool (or with a broken path to it) is evidence, not a
    failure: the module documents that it never fails on a host without a GPU.
    """
    if not isinstance(command, str) or not command.strip() or "\x00" in command:
        return "", "%r is not a command name or path" % (command,)
    if "/" in command:
        path = command if os.path.isfile(command) and os.access(command, os.X_OK) else None
        if not path:
            return "", "%s not installed (no executable file at that path)" % command
    else:
        path = module.get_bin_path(command)
    if not path:
        return "", "%s not installed" % command
    try:
        rc, out, err = module.run_command([path, *args], handle_exceptions=False)
    except (OSError, ValueError) as exc:
        return "", "%s could not run: %s" % (command, exc)
    if rc != 0:
        last = ((err or out).strip().splitlines() or [""])[-1]
        return "", "%s exited %d: %s" % (command, rc, last)
    return out, None


def _packages_missing(module: AnsibleModule) -> object:
    """The ``packages`` dpkg's status does not mark installed (None: no status to read); a bad option fails the
    module naming it."""
    p = module.params
    try:
        names = _packages.check_names("packages", p["packages"])
        status_path = check_path(
            "dpkg_status", p["dpkg_status"], fix="Give dpkg's status file, e.g. /var/lib/dpkg/status."
        )
    except UmaError as err:
        module.fail_json(msg=err.message)
    if not names:
        return []
    try:
        with open(status_path, encoding="utf-8", errors="replace") as handle:
            status_text = handle.read()
    except OSError:
        status_text = None
    return _packages.missing(names, status_text)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            proc_root=dict(type="path", default="/proc"),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            lscpu=dict(type="str", default="lscpu"),
            packages=dict(type="list", elements="str", default=[]),
            dpkg_status=dict(type="path", default=_packages.DPKG_STATUS),
        ),
        supports_check_mode=True,
    )
    p = module.params
    smi_out, smi_error = _run(module, p["nvidia_smi"], ["--query-gpu=name,memory.total", "--format=csv,noheader"])
    cpu_out, _unused = _run(module, p["lscpu"], [])
    facts = classify(
        gather_files(p["sysfs_root"], p["proc_root"]), parse_nvidia_smi_csv(smi_out), parse_lscpu(cpu_out), smi_error
    )
    try:
        facts["ram_gib"] = round(read_meminfo(p["proc_root"])["MemTotal"] / 1024**3, 2)
    except (OSError, KeyError, ValueError):
        facts["ram_gib"] = None
    facts["packages_missing"] = _packages_missing(module)
    module.exit_json(changed=False, ansible_facts={"uma_node": facts})


if __name__ == "__main__":
    main()
