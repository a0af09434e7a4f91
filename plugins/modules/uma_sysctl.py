#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: uma_sysctl
short_description: Page reserve and cache/dirty sysctls for vLLM on unified-memory nodes
version_added: 0.1.0
description:
  - Manages C(vm.min_free_kbytes), C(vm.vfs_cache_pressure), C(vm.dirty_ratio),
    C(vm.dirty_background_ratio) and optional extra C(vm.*) keys in ONE sysctl.d drop-in file,
    written atomically with a managed header and a fingerprint of its body.
  - Applies the values live (under C(/proc/sys)) unless O(apply=false), and reports drift of
    the file and of each live value separately.
  - Without an explicit O(min_free_kbytes) the reserve is sized from RAM by the rule
    C(uma-3pct-v1) - 3% of RAM rounded down to a multiple of 64 MiB, raised to at least the larger
    of 256 MiB and the kernel's own default (4*sqrt(RAM in kB) kB), cut to at most the smaller of
    8 GiB and 10% of RAM less 64 MiB (on a tiny node the cut wins). That gives
    3.56 GiB on a 119 GiB node and 3.62 GiB on a 121 GiB node (the published two-node fix used
    5 and 3 GiB). The result says which rule and inputs made the value.
  - Finds other files (sysctl.d directories and C(/etc/sysctl.conf)) that set the same keys and
    would win at boot under systemd-sysctl's ordering, reports them, and fails with
    O(conflicts=fail).
  - Before it first changes a live value it records the operator's value under O(state_dir);
    O(state=absent) removes the file and puts those values back.
  - Everything is validated before anything is touched; a refusal names the option, the value
    and the fix.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.NODE
options:
  state:
    description:
      - V(present) writes the file and applies the values.
      - V(absent) removes the file and restores the live values recorded before the first change.
    type: str
    choices: [present, absent]
    default: present
  min_free_kbytes:
    description:
      - Explicit page reserve in kB; wins over sizing from RAM.
      - A whole number between the kernel's own default for this RAM and 10% of RAM.
      - Declared C(raw) so that a bad value is refused with the fix, not a type error.
    type: raw
  ram_gib:
    description:
      - RAM in GiB to size the reserve from (and to bound O(min_free_kbytes)), instead of
        C(MemTotal) from C(/proc/meminfo). Use the inventory's per-host value. A positive number.
    type: raw
  vfs_cache_pressure:
    description: Value of C(vm.vfs_cache_pressure); 200 reclaims dentries/inodes twice as eagerly.
    type: raw
    default: 200
  dirty_ratio:
    description: Value of C(vm.dirty_ratio) in percent (1-100).
    type: raw
    default: 5
  dirty_background_ratio:
    description: Value of C(vm.dirty_background_ratio) in percent (1-100), below O(dirty_ratio).
    type: raw
    default: 2
  extra:
    description:
      - More C(vm.*) keys to manage in the same file, as a mapping of key to integer (or a
        space-separated integer list). Keys outside C(vm.), keys this kernel lacks,
        C(vm.dirty_bytes)/C(vm.dirty_background_bytes) and C(vm.drop_caches) are refused.
    type: dict
    default: {}
  path:
    description: The drop-in file.
    type: path
    default: /etc/sysctl.d/90-vllm.conf
  apply:
    description: Also write the values under O(proc_root)C(/sys/vm) now.
    type: bool
    default: true
  conflicts:
    description:
      - What to do when another file sets one of the keys and would win at boot.
      - V(warn) reports them as warnings, V(fail) refuses before touching anything, V(ignore) only returns them.
    type: str
    choices: [warn, fail, ignore]
    default: warn
  proc_root:
    description: Root of procfs (C(meminfo) and C(sys/vm)); tests point it at a temporary tree.
    type: path
    default: /proc
  sysctl_dirs:
    description: The sysctl.d search directories, in systemd-sysctl's priority order.
    type: list
    elements: path
    default: [/etc/sysctl.d, /run/sysctl.d, /usr/local/lib/sysctl.d, /usr/lib/sysctl.d, /lib/sysctl.d]
  sysctl_conf:
    description: The legacy file that C(sysctl --system) applies last.
    type: path
    default: /etc/sysctl.conf
  state_dir:
    description: Where the operator's original live values are recorded (C(sysctl-original.json)).
    type: path
    default: /var/lib/uma-vllm
notes:
  - C(vm.*) sysctls are not namespaced; inside a container they change the host kernel.
  - Writing C(vm.dirty_ratio) makes the kernel zero C(vm.dirty_bytes), as documented for these knobs.
seealso:
  - module: ansible.posix.sysctl
  - module: uma.vllm.drop_cache_loop
"""

EXAMPLES = r"""
- name: Size the reserve from the inventory's RAM and apply the published cache settings
  uma.vllm.uma_sysctl:
    ram_gib: "{{ uma_ram_gib }}"
  become: true

- name: Explicit per-host reserve (3 GiB), refuse if another file would override it at boot
  uma.vllm.uma_sysctl:
    min_free_kbytes: 3145728
    conflicts: fail
  become: true

- name: Only write the file (applied at next boot by systemd-sysctl)
  uma.vllm.uma_sysctl:
    path: /etc/sysctl.d/90-vllm.conf
    apply: false
    extra:
      vm.swappiness: 10
  become: true

- name: Put the node back as it was
  uma.vllm.uma_sysctl:
    state: absent
  become: true
"""

RETURN = r"""
path:
  description: The drop-in file.
  returned: always
  type: str
  sample: /etc/sysctl.d/90-vllm.conf
settings:
  description: The managed keys and the values in force after the run (empty for O(state=absent)).
  returned: always
  type: dict
  sample: {"vm.min_free_kbytes": "3801088", "vm.vfs_cache_pressure": "200", "vm.dirty_ratio": "5",
           "vm.dirty_background_ratio": "2"}
sizing:
  description: How C(vm.min_free_kbytes) was chosen - rule (C(uma-3pct-v1) or C(explicit)), RAM and its source, bounds.
  returned: when state is present
  type: dict
  sample: {"rule": "uma-3pct-v1", "ram_gib": 121.0, "ram_source": "ram_gib", "min_free_kbytes": 3801088,
           "kernel_default_kbytes": 45056, "floor_kbytes": 262144, "ceiling_kbytes": 8388608}
live_before:
  description: Live values before the run (C(null) where the kernel lacks the key).
  returned: always
  type: dict
  sample: {"vm.min_free_kbytes": "67584"}
live_after:
  description: Live values after the run (predicted in check mode).
  returned: always
  type: dict
  sample: {"vm.min_free_kbytes": "3801088"}
drift:
  description:
    - What differed from the wanted state before the run.
    - C(file) is null, V(missing), V(present), V(edited by hand (fingerprint mismatch)), V(settings differ)
      or V(header removed or file replaced); C(live) maps each differing key to expected/actual.
  returned: always
  type: dict
  sample: {"file": "edited by hand (fingerprint mismatch)",
           "live": {"vm.dirty_ratio": {"expected": "5", "actual": "20"}}}
conflicts:
  description: Other files setting the managed keys; C(wins_at_boot) says whether they override this file.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/sysctl.d/99-local.conf", "key": "vm.dirty_ratio", "value": "20", "wins_at_boot": true,
            "reason": "applied after ours"}]
original:
  description: The operator's values recorded before the first change (restored by O(state=absent)).
  returned: always
  type: dict
  sample: {"vm.min_free_kbytes": "67584", "vm.dirty_ratio": "20"}
"""

from typing import Any, Dict, List

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import path_error
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.flow import Refusal, run_module
from ansible_collections.uma.vllm.plugins.module_utils.system.sysctl import (
    DEFAULT_SYSCTL_CONF,
    DEFAULT_SYSCTL_DIRS,
    SysctlRequest,
    execute,
    plan,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="present", choices=["present", "absent"]),
            min_free_kbytes=dict(type="raw"),
            ram_gib=dict(type="raw"),
            vfs_cache_pressure=dict(type="raw", default=200),
            dirty_ratio=dict(type="raw", default=5),
            dirty_background_ratio=dict(type="raw", default=2),
            extra=dict(type="dict", default={}),
            path=dict(type="path", default="/etc/sysctl.d/90-vllm.conf"),
            apply=dict(type="bool", default=True),
            conflicts=dict(type="str", default="warn", choices=["warn", "fail", "ignore"]),
            proc_root=dict(type="path", default="/proc"),
            sysctl_dirs=dict(type="list", elements="path", default=list(DEFAULT_SYSCTL_DIRS)),
            sysctl_conf=dict(type="path", default=DEFAULT_SYSCTL_CONF),
            state_dir=dict(type="path", default=_paths.STATE_DIR),
        ),
        supports_check_mode=True,
    )
    request = SysctlRequest(**module.params)
    paths = {
        "path": request.path,
        "state_dir": request.state_dir,
        "proc_root": request.proc_root,
        "sysctl_dirs": request.sysctl_dirs,
        "sysctl_conf": request.sysctl_conf,
    }

    def refuse(p: Any) -> None:
        winners = [c for c in p.conflicts if c["wins_at_boot"]]
        if winners and request.conflicts == "fail":
            raise Refusal(
                "option 'conflicts' = 'fail': %d setting(s) in other files would override %s at boot: %s. "
                "Remove them from those files, or rename this file to sort after them."
                % (
                    len(winners),
                    p.path,
                    "; ".join("%s sets %s = %s" % (c["path"], c["key"], c["value"]) for c in winners),
                ),
                conflicts=p.conflicts,
            )

    def warnings(p: Any) -> List[str]:
        if request.conflicts != "warn":
            return []
        return [
            "%s sets %s = %s and wins over %s at boot (%s)" % (c["path"], c["key"], c["value"], p.path, c["reason"])
            for c in p.conflicts
            if c["wins_at_boot"]
        ]

    def result(p: Any, _done: Any) -> Dict[str, Any]:
        out = dict(
            changed=p.changed,
            path=p.path,
            settings={k: v for k, v in p.live_after.items() if k in p.values} if request.apply else dict(p.values),
            live_before=p.live_before,
            live_after=p.live_after,
            drift=p.drift,
            conflicts=p.conflicts,
            original=(p.record_after if p.state == "present" else p.record_before) or {},
        )
        if p.state == "present":
            out["sizing"] = p.sizing
        return out

    run_module(
        module,
        lambda: plan(request),
        lambda p: execute(p, request.proc_root),
        result,
        refuse=refuse,
        warnings=warnings,
        diff=lambda p: p.diff(),
        translate=(OSError, lambda err: path_error(err, paths)),
    )


if __name__ == "__main__":
    main()
