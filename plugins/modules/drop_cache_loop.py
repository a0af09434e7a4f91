#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drop_cache_loop
short_description: Run the page-cache guard on the node under systemd while a model loads
version_added: 0.1.0
description:
  - Starts the page-cache guard (C(uma_guard.py)) as the transient systemd service C(uma-guard-NAME.service) on
    the node, so it keeps running after the Ansible connection that started it is gone, and stops by itself -
    after O(max_duration), when O(until_url) answers HTTP 200, or when process O(until_pid) exits.
  - The guard evicts the checkpoint's pages from the page cache once they are read, so the cache does not
    crowd out the GPU's allocations on a unified-memory machine (DGX Spark GB10, GH200, Jetson Thor).
    V(files) uses C(posix_fadvise) on O(paths) only, V(global) writes C(/proc/sys/vm/drop_caches) every tick,
    V(adaptive) acts only when the unmapped file cache grows more than O(threshold_mib) (on O(paths) when given,
    else globally).
  - The program (C(uma_guard.py) and the collection's node package C(uma_vllm_node/) it runs from) is installed
    into O(lib_dir) from the collection's own source (a change only when the content differs).
  - O(state=started) when a guard with the same configuration already runs changes nothing; a different
    configuration (or a new program version) restarts it. Starting twice leaves one guard.
  - O(state=stopped) stops it (SIGTERM; the guard writes its final status) and returns the final status and
    statistics. A guard that already stopped by itself is reported unchanged with its last status.
  - Options are validated on the node before anything is touched; a refusal names the option, the value and
    the fix.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.NODE
options:
  state:
    description:
      - V(started) runs the guard (restarting it when the configuration differs).
      - V(stopped) stops it and returns its final status.
    type: str
    choices: [started, stopped]
    default: started
  name:
    description:
      - Name of the guard; the unit is C(uma-guard-NAME.service), the status C(RUN_DIR/guard-NAME.json).
      - 1-64 characters from C(A-Z a-z 0-9 _ . -), starting with a letter or digit.
    type: str
    required: true
  mode:
    description:
      - V(files) - evict only the files under O(paths) (no root needed by the guard itself, no collateral).
      - V(global) - write O(drop_level) to C(/proc/sys/vm/drop_caches) every tick (root; evicts every workload's
        cache). O(paths) must be empty.
      - V(adaptive) - act only when the unmapped file cache grew by O(threshold_mib) or C(MemAvailable) fell
        below O(min_available_mib); with O(paths) it evicts those files, without them it drops globally.
        With O(act_below_free_mib) growth is left alone while C(MemFree) is above that.
    type: str
    choices: [global, files, adaptive]
    default: adaptive
  paths:
    description:
      - Files or directories (walked recursively) on the node, typically the model directory. Absolute and
        existing. Required for O(mode=files).
    type: list
    elements: str
    default: []
  interval:
    description: Seconds between ticks (the adaptive mode polls faster while the cache grows). More than 0, at most 60.
    type: raw
    default: 0.1
  threshold_mib:
    description:
      - Growth of the unmapped file cache (MiB) that makes the adaptive mode act. 1 to 1048576.
      - The default is the guard's own (C(uma_guard.py --threshold-mib)), chosen by the page-cache benchmark.
    type: raw
    default: 16
  min_available_mib:
    description: The adaptive mode also acts while C(MemAvailable) is below this (MiB); 0 turns it off.
    type: raw
    default: 0
  act_below_free_mib:
    description:
      - The adaptive mode evicts growth only while C(MemFree) is below this (MiB); 0 (the default) acts at every
        O(threshold_mib) of growth. 0 to 1048576; other than 0 only with O(mode=adaptive).
      - Page cache in free memory stands in nobody's way, and evicting it costs the kernel about 0.15 s of CPU per
        GiB freed; give the memory the loader's engine will still take (the launcher gives the engine's startup
        request).
    type: raw
    default: 0
  drop_level:
    description: What a global drop writes to C(drop_caches) - 1 (page cache) or 3 (also dentries and inodes).
    type: int
    choices: [1, 3]
    default: 1
  max_duration:
    description:
      - Seconds after which the guard stops by itself, 1 to 86400. systemd also stops the unit 60 s later
        (C(RuntimeMaxSec)) should the guard hang.
    type: raw
    default: 900
  until_url:
    description: Stop when this http(s) URL answers HTTP 200 (for example vLLM's C(/health)).
    type: str
  until_pid:
    description: Stop when this process exits (for example the loader's PID). It must exist when the guard starts.
    type: raw
  samples_file:
    description: Also write one JSON line of memory figures per tick to this absolute path on the node.
    type: str
  python:
    description: The node's Python 3 interpreter that runs the guard.
    type: str
    default: /usr/bin/python3
  lib_dir:
    description: Where the guard program (C(uma_guard.py), C(node/base/common.py)) is installed on the node.
    type: str
    default: /usr/local/lib/uma-vllm
  run_dir:
    description:
      - Where the guard's status (C(guard-NAME.json)) and the unit's configuration (C(guard-NAME.unit.json)) live.
    type: str
    default: /run/uma-vllm
  proc_root:
    description: Root of procfs, for the O(until_pid) and C(drop_caches) checks; tests point it at a temporary tree.
    type: path
    default: /proc
notes:
  - The unit is transient (C(systemd-run)); nothing of it survives a reboot, and neither does the status under
    C(/run). A reboot therefore never leaves a guard running.
  - C(/proc/sys/vm/drop_caches) is not namespaced; in a container a global drop empties the host's cache.
seealso:
  - module: uma.vllm.readahead_window
  - module: uma.vllm.uma_sysctl
"""

EXAMPLES = r"""
- name: Guard the page cache while vLLM loads Llama 70B, until the server is healthy (at most 15 min)
  uma.vllm.drop_cache_loop:
    name: llama70b
    mode: files
    paths:
      - /models/llama-3.1-70b
    until_url: http://127.0.0.1:8000/health
    max_duration: 900
  become: true

- name: The PID of the vLLM server loading the model (read-only, so it runs in check mode too)
  ansible.builtin.command: pgrep -o -f "vllm serve"
  register: loader
  changed_when: false
  check_mode: false

- name: The published global fix, bounded by the loader's lifetime
  uma.vllm.drop_cache_loop:
    name: loader
    mode: global
    interval: 1
    until_pid: "{{ loader.stdout }}"
  become: true

- name: Stop it and keep its statistics
  uma.vllm.drop_cache_loop:
    name: llama70b
    state: stopped
  become: true
  register: guard

- name: Show what it did (no status when it never ran, as in check mode)
  ansible.builtin.debug:
    msg: "evicted {{ guard.status.evicted_bytes }} bytes, peak cache growth {{ guard.status.peak_growth_mib }} MiB"
  when: guard.status is not none
"""

RETURN = r"""
unit:
  description: The systemd unit of the guard.
  returned: always
  type: str
  sample: uma-guard-llama70b.service
active:
  description: Whether the guard runs after this task (predicted in check mode).
  returned: always
  type: bool
  sample: true
action:
  description: What the task did (or would do) - V(started), V(restarted), V(unchanged), V(stopped) or V(none).
  returned: always
  type: str
  sample: started
pid:
  description: The guard's process id (C(MainPID) of the unit), 0 when it does not run.
  returned: always
  type: int
  sample: 4242
config:
  description: The guard's configuration as the module passes it.
  returned: always
  type: dict
  sample: {"mode": "files", "paths": ["/models/llama-3.1-70b"], "interval": 0.1, "threshold_mib": 16,
           "min_available_mib": 0, "act_below_free_mib": 0, "drop_level": 1, "max_duration": 900.0,
           "until_url": null, "until_pid": null,
           "samples_file": null}
fingerprint:
  description: Fingerprint of the configuration and the program version, kept in the unit's description.
  returned: always
  type: str
  sample: 3f2a9c0d1e4b5a67
status_file:
  description: The guard's status file on the node.
  returned: always
  type: str
  sample: /run/uma-vllm/guard-llama70b.json
status:
  description:
    - The guard's status JSON (C(null) before its first run) - C(name), C(mode), C(pid), C(state) (V(running) or
      V(stopped)), C(started_at), C(stopped_at), C(elapsed_s), C(ticks), C(evictions), C(evicted_bytes),
      C(baseline_cache_mib), C(peak_cache_mib), C(peak_growth_mib), C(peak_mapped_mib), C(min_available_mib),
      C(held_ticks) (ticks whose growth O(act_below_free_mib) left alone), C(cpu_seconds), C(stop_reason)
      (V(max_duration), V(until_url), V(until_pid), V(signal) or C(error...)) and
      C(config).
  returned: always
  type: dict
  sample: {"name": "llama70b", "state": "stopped", "stop_reason": "until_url", "elapsed_s": 212.4,
           "evictions": 1310, "evicted_bytes": 139586437120, "peak_growth_mib": 61.2, "cpu_seconds": 3.1}
node_files:
  description: The node-side programs in O(lib_dir), whether this run wrote them, and their checksums.
  returned: when state is started
  type: list
  elements: dict
  sample: [{"path": "/usr/local/lib/uma-vllm/uma_guard.py", "changed": false, "sha256": "9c1e...",
            "sha256_before": "9c1e..."}]
"""

from typing import Any, Dict

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import Systemd
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import config as guard
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.flow import run_module
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.module import strict_module
from ansible_collections.uma.vllm.plugins.module_utils.system import guard_service as svc


def main() -> None:
    module = strict_module(
        argument_spec=dict(
            state=dict(type="str", default="started", choices=["started", "stopped"]),
            name=dict(type="str", required=True),
            mode=dict(type="str", default=guard.DEFAULT_MODE, choices=list(guard.MODES)),
            paths=dict(type="list", elements="str", default=[]),
            interval=dict(type="raw", default=guard.DEFAULT_INTERVAL),
            threshold_mib=dict(type="raw", default=guard.DEFAULT_THRESHOLD_MIB),
            min_available_mib=dict(type="raw", default=guard.DEFAULT_MIN_AVAILABLE_MIB),
            act_below_free_mib=dict(type="raw", default=guard.DEFAULT_ACT_BELOW_FREE_MIB),
            drop_level=dict(type="int", default=guard.DEFAULT_DROP_LEVEL, choices=list(guard.DROP_LEVELS)),
            max_duration=dict(type="raw", default=int(guard.DEFAULT_MAX_DURATION)),
            until_url=dict(type="str"),
            until_pid=dict(type="raw"),
            samples_file=dict(type="str"),
            python=dict(type="str", default=_paths.PYTHON),
            lib_dir=dict(type="str", default=_paths.LIB_DIR),
            run_dir=dict(type="str", default=_paths.RUN_DIR),
            proc_root=dict(type="path", default="/proc"),
        ),
        supports_check_mode=True,
    )

    systemd = Systemd.for_module(module)
    request = svc.GuardRequest(**module.params)

    def result(p: svc.GuardPlan, done: Any) -> Dict[str, Any]:
        if done is None:  # not executed (no change, or check mode): what runs now
            return svc.result(p, svc.read_status(p.status_file), p.pid_before if p.active_after else 0)
        return svc.result(p, done["status"], done["pid"], done["pid"] > 0)

    run_module(
        module,
        lambda: svc.plan(request, systemd),
        lambda p: svc.execute(p, systemd, module.warn),
        result,
        failed_result=lambda p: svc.result(p, svc.read_status(p.status_file), 0),
        diff=lambda p: p.diff(),
    )


if __name__ == "__main__":
    main()
