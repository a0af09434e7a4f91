#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: readahead_window
short_description: Throttle block-device readahead for a time window, restored by a timer on the node
version_added: 0.1.0
description:
  - Lowers C(queue/read_ahead_kb) of the block device(s) that hold O(path) (or of O(device)) for O(duration)
    seconds, typically while vLLM loads a model whose weights would otherwise be read ahead into page cache
    that competes with the GPU for the shared memory of a unified-memory machine.
  - Resolves the devices from sysfs - a partition to its disk (C(nvme0n1p1) to C(nvme0n1), C(sda1) to C(sda)),
    a device-mapper or md device to itself and, recursively, the disks under it (C(slaves/)); loop, NVMe and
    virtio disks are leaves. Filesystems without a device number of their own (btrfs) are resolved through
    the mount's source device.
  - Records the values found before the first throttle in O(state_dir)C(/readahead-NAME.json); a second run
    while the window is open keeps the first record (it never records the throttled value as the original).
  - The window is closed ON THE NODE by a transient systemd timer C(uma-readahead-restore-NAME.timer) that
    runs C(uma_readahead.py restore) from O(lib_dir), so a play that fails or loses its connection after this
    task never leaves a disk throttled. An enabled oneshot C(uma-readahead-restore.service) restores every pending
    record at boot, for a reboot or container restart in the middle of a window.
  - The restorer program (C(uma_readahead.py) and the collection's node package C(uma_vllm_node/) it runs
    from) is installed into O(lib_dir) from the collection's own source (a change only when the content differs).
  - O(state=restored) closes the window now - restores the recorded values, stops the timer and deletes the
    record.
  - O(persist=true) also writes a udev rule with the steady-state (restored) value per device, for the next
    boot and hot-plug.
  - Everything is validated before anything is touched; a refusal names the option, the value and the fix.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.NODE
options:
  state:
    description:
      - V(throttled) opens the window (or keeps an open one as it is).
      - V(restored) closes it now.
    type: str
    choices: [throttled, restored]
    default: throttled
  name:
    description:
      - Name of the window; one record and one timer per name. 1-64 characters from C(A-Z a-z 0-9 _ . -).
    type: str
    default: default
  path:
    description:
      - A file or directory (the model directory) on the node; the devices holding it are throttled.
      - Mutually exclusive with O(device); one of them is required for O(state=throttled).
    type: path
  device:
    description:
      - A block device name or node, for example C(nvme0n1), C(/dev/nvme0n1), C(/dev/mapper/vg-models), C(dm-0).
    type: str
  read_ahead_kb:
    description:
      - The value during the window, in KiB. C(0) turns readahead off.
      - A whole number from 0 to 4294967295 (the kernel's limit). The kernel keeps whole pages, so the value
        reads back rounded down to a multiple of the page size (4 KiB, or 64 KiB on some arm64 kernels).
    type: raw
    default: 8
  duration:
    description:
      - Length of the window in seconds, from the moment it opens, 1 to 86400. Re-running the task while the
        window is open does not move its end.
    type: raw
    default: 180
  persist:
    description:
      - Also write a udev rule (O(udev_rules_dir)C(/60-uma-vllm-readahead.rules)) that sets each resolved device
        to its steady-state value - the value recorded before the window (the restored value).
      - Entries for other devices in that file are kept.
    type: bool
    default: false
  python:
    description: The node's Python 3 interpreter that runs the restorer under systemd.
    type: str
    default: /usr/bin/python3
  lib_dir:
    description: Where the node-side programs (C(node/base/blockdev.py), C(node/base/common.py)) are installed.
    type: str
    default: /usr/local/lib/uma-vllm
  state_dir:
    description:
      - Where the records of open windows live (C(readahead-NAME.json)); must survive a reboot.
      - A record that is there but damaged (not JSON, or an entry whose C(device), C(dev) or C(original_kb)
        cannot be read) holds the devices' original values all the same; it is refused, naming the file,
        the field and the fix, and nothing changes. It is never taken for no record.
    type: str
    default: /var/lib/uma-vllm
  systemd_dir:
    description: Where the boot-time restore unit C(uma-readahead-restore.service) is written.
    type: path
    default: /etc/systemd/system
  udev_rules_dir:
    description: Where the rule of O(persist=true) is written.
    type: path
    default: /etc/udev/rules.d
  sysfs_root:
    description: Root of sysfs; tests point it at a temporary tree.
    type: path
    default: /sys
  proc_root:
    description: Root of procfs (C(self/mountinfo) for filesystems without a device number).
    type: path
    default: /proc
notes:
  - C(/sys/block/*/queue/read_ahead_kb) is not namespaced; inside a container this changes the host kernel's
    value, and a container restart does not reset it (the boot unit does).
  - udev does not run inside containers; the rule of O(persist=true) then only takes effect on a real boot.
  - The udev rule matches the kernel name (C(KERNEL==)); names of NVMe namespaces can change between boots
    on machines with several controllers.
seealso:
  - module: uma.vllm.drop_cache_loop
"""

EXAMPLES = r"""
- name: Throttle readahead of the model disk for 3 minutes while vLLM maps the weights
  uma.vllm.readahead_window:
    name: llama70b
    path: /models/llama-3.1-70b
    read_ahead_kb: 8
    duration: 180
  become: true

- name: Same, by device, and keep the operator's value for the next boot in a udev rule
  uma.vllm.readahead_window:
    device: /dev/nvme0n1
    persist: true
  become: true

- name: Close the window as soon as the server answers
  uma.vllm.readahead_window:
    name: llama70b
    state: restored
  become: true
"""

RETURN = r"""
state:
  description: The requested state.
  returned: always
  type: str
  sample: throttled
devices:
  description:
    - The devices the window applies to, with their recorded original value and the live value before and
      after the run (predicted in check mode). C(role) is C(disk), or C(holder) for dm/md devices.
  returned: always
  type: list
  elements: dict
  sample: [{"device": "nvme0n1", "dev": "259:0", "role": "disk", "original_kb": 128, "before_kb": 128,
            "after_kb": 8}]
read_ahead_kb:
  description: The requested value and what the kernel keeps of it (C(effective_kb), whole pages).
  returned: always
  type: dict
  sample: {"requested_kb": 8, "effective_kb": 8, "page_kb": 4}
window:
  description:
    - The window - C(open), the timer unit, when it opened and when the timer restores the values
      (seconds since the epoch), and the record file.
  returned: always
  type: dict
  sample: {"open": true, "timer": "uma-readahead-restore-llama70b.timer", "opened_at": 1767225600,
           "ends_at": 1767225780, "duration": 180, "record": "/var/lib/uma-vllm/readahead-llama70b.json"}
record:
  description: Content of the record after the run (C(null) once restored).
  returned: always
  type: dict
  sample: {"name": "llama70b", "read_ahead_kb": 8, "duration": 180, "opened_at": 1767225600,
           "ends_at": 1767225780, "devices": [{"device": "nvme0n1", "dev": "259:0", "original_kb": 128}]}
restored:
  description: For O(state=restored) - the devices put back, and devices skipped (gone, or the name now names
    another disk).
  returned: when state is restored
  type: dict
  sample: {"restored": [{"device": "nvme0n1", "read_ahead_kb": 128}], "skipped": []}
boot_unit:
  description: The boot-time restore unit - its path and whether it is enabled (predicted in check mode).
  returned: when state is throttled
  type: dict
  sample: {"path": "/etc/systemd/system/uma-readahead-restore.service", "enabled": true, "changed": false}
udev_rules:
  description: The udev rule file and the steady-state values in it.
  returned: when persist is true
  type: dict
  sample: {"path": "/etc/udev/rules.d/60-uma-vllm-readahead.rules", "entries": {"nvme0n1": 128}, "changed": true}
node_files:
  description: The node-side programs in O(lib_dir), whether this run wrote them, and their checksums.
  returned: when state is throttled
  type: list
  elements: dict
  sample: [{"path": "/usr/local/lib/uma-vllm/uma_readahead.py", "changed": false, "sha256": "9c1e...",
            "sha256_before": "9c1e..."}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import Systemd
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.flow import run_module
from ansible_collections.uma.vllm.plugins.module_utils.system.readahead import (
    WindowRequest,
    execute,
    plan,
    result,
    validate,
)

# The module's Python API as before the logic moved to _readahead (tests call it from here).
__all__ = ["WindowRequest", "execute", "main", "plan", "result", "validate"]


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="throttled", choices=["throttled", "restored"]),
            name=dict(type="str", default="default"),
            path=dict(type="path"),
            device=dict(type="str"),
            read_ahead_kb=dict(type="raw", default=8),
            duration=dict(type="raw", default=180),
            persist=dict(type="bool", default=False),
            python=dict(type="str", default=_paths.PYTHON),
            lib_dir=dict(type="str", default=_paths.LIB_DIR),
            state_dir=dict(type="str", default=_paths.STATE_DIR),
            systemd_dir=dict(type="path", default="/etc/systemd/system"),
            udev_rules_dir=dict(type="path", default="/etc/udev/rules.d"),
            sysfs_root=dict(type="path", default="/sys"),
            proc_root=dict(type="path", default="/proc"),
        ),
        mutually_exclusive=[("path", "device")],
        supports_check_mode=True,
    )

    systemd = Systemd.for_module(module)
    request = WindowRequest(**module.params)
    run_module(
        module,
        lambda: plan(request, systemd),
        lambda p: execute(p, systemd),
        lambda p, _done: result(p),
        warnings=lambda p: p.warnings,
        failed_result=result,
        diff=lambda p: p.diff(),
    )


if __name__ == "__main__":
    main()
