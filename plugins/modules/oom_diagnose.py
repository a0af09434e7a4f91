#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: oom_diagnose
short_description: Tell why a vLLM engine ran out of memory on a unified-memory node, and what fixes it
version_added: 0.1.0
description:
  - Reads the evidence on the node - the kernel log (C(NV_ERR_NO_MEMORY), C(oom-killer) traces through
    C(nvidia_uvm) / C(sysmemAllocResources)), each engine's journal (launcher, vLLM and systemd lines),
    the launcher's C(launch.json) and the guard's C(samples.jsonl), the engine's C(/metrics), the
    guard's status file, C(/proc/meminfo) and the C(vm.*) sysctls in force.
  - Classifies each engine as one of C(admission_refused) (the launcher refused the start, MemAvailable
    or on a discrete GPU the GPU's free memory below the plan's startup request, exit 75),
    C(startup_oom) (weights + KV cache over the budget),
    C(page_cache_starvation) (UMA page cache held the memory at load), C(profiling_race) (another
    engine started at the same time), C(runtime_burst) (long prompts / batched tokens),
    C(fragmentation) (allocator fragmentation, chronic OOMs), C(prefix_cache_pressure) (full KV cache,
    queue and preemptions) or C(none), with the evidence lines that decided it, a confidence and the
    concrete change (a flag, a sysctl, a guard mode, a re-plan with M(uma.vllm.vllm_flags)).
  - Returns a Markdown report and, per engine, an SVG of the memory timeline of the launch with the
    KV-cache allocation moment marked. It only reads; writing the reports is the caller's (see the
    playbook C(uma.vllm.diagnose)).
  - Reads the engine watchdog's records (C(<state_dir>/watchdog/<engine>/state.json) and C(events.json),
    written by C(uma_watchdog.py)) and reports what it saw and did - wedges, memory floor events and
    evictions, restarts (with their kind and the observations that decided them), a give-up - under
    RV(diagnoses[].watchdog) and in the report's "Engine watchdog" section.
  - Sources that are missing or unreadable are reported under RV(sources), never a failure.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.read_only
options:
  engines:
    description:
      - Engines to diagnose (the C(<engine>) of C(uma-vllm@<engine>.service)).
      - Empty means every engine that has a launch directory under O(state_dir)C(/launches) or watchdog
        records under O(state_dir)C(/watchdog); with none, one node-level diagnosis from the kernel log alone.
    type: list
    elements: str
    default: []
  launch:
    description: Which launch directory of each engine to read; V(latest) follows the C(latest) symlink.
    type: str
    default: latest
  state_dir:
    description: The collection's state directory (launch records under C(launches/<engine>/)).
    type: path
    default: /var/lib/uma-vllm
  run_dir:
    description: Where the guard keeps C(guard-<engine>.json) while it runs.
    type: path
    default: /run/uma-vllm
  proc_root:
    description: Root of procfs (C(meminfo), C(sys/vm/*)); tests point it at a temporary directory.
    type: path
    default: /proc
  sysctl_keys:
    description: Sysctls whose live values the report shows as settings in force.
    type: list
    elements: str
    default: [vm.min_free_kbytes, vm.vfs_cache_pressure, vm.dirty_ratio, vm.dirty_background_ratio, vm.swappiness,
              vm.watermark_scale_factor, vm.overcommit_memory]
  journal_command:
    description:
      - Command that prints an engine's journal; C({engine}) and C({lines}) are replaced.
      - Its lines should carry ISO timestamps (C(-o short-iso)) so kernel and engine events line up.
    type: list
    elements: str
    default: [journalctl, -u, "uma-vllm@{engine}.service", -o, short-iso, --no-pager, -q, -n, "{lines}"]
  journal_dir:
    description:
      - Read C(<engine>.log) from this directory instead of running O(journal_command) (tests, or
        journals exported elsewhere).
    type: path
  kernel_commands:
    description:
      - Commands tried in order until one prints something, for the kernel log; C({lines}) is replaced.
    type: list
    elements: list
    default:
      - [journalctl, -k, -o, short-iso, --no-pager, -q, -n, "{lines}"]
      - [dmesg, --time-format, iso]
  kernel_log_file:
    description: Read the kernel log from this file instead of running O(kernel_commands).
    type: path
  lines:
    description: How many journal / kernel log lines to read at most (a whole number, 100 or more).
    type: raw
    default: 20000
  metrics_urls:
    description:
      - Per engine, the URL of its C(/metrics) (mapping engine to URL). Engines without one are
        diagnosed without metrics.
    type: dict
    default: {}
  metrics_timeout:
    description: Seconds to wait for a C(/metrics) answer (a number above 0).
    type: raw
    default: 5
  cache_fraction:
    description:
      - Reclaimable page cache (C(Cached) minus C(Mapped)) at the failure, as a fraction of C(MemTotal),
        from which page cache counts as the cause of a failed load (a number between 0 and 1).
    type: raw
    default: 0.15
  kv_usage_high:
    description: KV cache usage (0-1) from which the cache counts as full.
    type: raw
    default: 0.9
  report_host:
    description: Host name in the report's title; the node's own name when not set.
    type: str
  timeline_name:
    description: File name the report links for an engine's timeline; C({host}) and C({engine}) are replaced.
    type: str
    default: "{host}-{engine}.svg"
notes:
  - C(NV_ERR_NO_MEMORY) alone is not taken as an OOM; published GB10 logs show it during loads that went
    healthy. It counts next to a failed start or a kill.
seealso:
  - module: uma.vllm.vllm_flags
  - module: uma.vllm.uma_sysctl
"""

EXAMPLES = r"""
- name: Diagnose every engine on the node
  uma.vllm.oom_diagnose:
  register: diag

- name: One engine, with its metrics endpoint
  uma.vllm.oom_diagnose:
    engines: [qwen]
    metrics_urls:
      qwen: http://127.0.0.1:8000/metrics

- name: From exported logs (no journal on this host)
  uma.vllm.oom_diagnose:
    engines: [qwen]
    journal_dir: /srv/support/case-42/journal
    kernel_log_file: /srv/support/case-42/dmesg.txt
    state_dir: /srv/support/case-42/uma-vllm

- name: Show the verdict
  ansible.builtin.debug:
    msg: "{{ diag.class }}: {{ diag.diagnoses[0].fix | first }}"
"""

RETURN = r"""
class:
  description: The node's verdict - the most confident class over its engines, C(none) when none found.
  returned: always
  type: str
  sample: page_cache_starvation
diagnoses:
  description: One entry per engine (or one node-level entry when there are no engines).
  returned: always
  type: list
  elements: dict
  contains:
    engine:
      description: Engine name, or null for the node-level entry.
      type: str
    class:
      description: The class id.
      type: str
    title:
      description: The class in words.
      type: str
    confidence:
      description: 0-1; how strongly the evidence points to the class.
      type: float
    evidence:
      description: The lines (log lines, computed facts) that decided it.
      type: list
      elements: str
    fix:
      description: The concrete changes to make, most effective first.
      type: list
      elements: str
    others:
      description: Other classes that matched with less confidence, with their evidence and fix.
      type: list
      elements: dict
    settings:
      description: The settings in force (engine flags, plan, sysctls, guard).
      type: dict
    summary:
      description: What was read (launch, runs in the journal, restarts, samples, KV allocation time).
      type: dict
    metrics:
      description: The values read from C(/metrics) (KV usage and which metric name, running, waiting...).
      type: dict
    watchdog:
      description:
        - What the engine watchdog saw and did, from its C(state.json) and C(events.json); null when it
          left no records. Unreadable records are counted under C(unreadable), never a failure.
        - C(phase), C(reason), C(gave_up), C(counts) (wedges, restarts, floor_warn, floor_critical, gave_up),
          C(restarts), C(floor_restarts), C(evictions), and C(events) (the last 20 actions, each with C(at),
          C(action), C(reason) and C(evidence) phrases such as C(kind floor) or C(MemAvailable 600.0 MiB ...)).
      type: dict
  sample:
    - engine: dsv4
      class: page_cache_starvation
      title: UMA page-cache starvation at load
      confidence: 0.9
      evidence: ["ai2 kernel: NVRM: ... NV_ERR_NO_MEMORY ...", "samples.jsonl t=110.0s: Cached-Mapped 36.70 GiB ..."]
      fix: ["Run the load with the page-cache guard in 'evict' mode ..."]
report:
  description: The node's report in Markdown (one section per engine).
  returned: always
  type: str
timelines:
  description: Per engine, the SVG of the last launch's memory samples, and the file name the report links.
  returned: always
  type: list
  elements: dict
  contains:
    engine:
      description: Engine name.
      type: str
    file:
      description: File name used in the report (O(timeline_name)).
      type: str
    svg:
      description: The SVG document.
      type: str
sources:
  description: Per source, what was read or why not (missing file, command not found, HTTP error).
  returned: always
  type: dict
  sample: {kernel: "journalctl -k: 2211 lines", "journal:qwen": "command not found: journalctl"}
changed:
  description: Always false; the module only reads.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import node
from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError


def argument_spec():
    """The options (DOCUMENTATION above); checked further by _diagnose_node.checked_request."""
    return dict(
        engines=dict(type="list", elements="str", default=[]),
        launch=dict(type="str", default="latest"),
        state_dir=dict(type="path", default=_paths.STATE_DIR),
        run_dir=dict(type="path", default=_paths.RUN_DIR),
        proc_root=dict(type="path", default="/proc"),
        sysctl_keys=dict(
            type="list",
            elements="str",
            no_log=False,
            default=[
                "vm.min_free_kbytes",
                "vm.vfs_cache_pressure",
                "vm.dirty_ratio",
                "vm.dirty_background_ratio",
                "vm.swappiness",
                "vm.watermark_scale_factor",
                "vm.overcommit_memory",
            ],
        ),
        journal_command=dict(
            type="list",
            elements="str",
            default=[
                "journalctl",
                "-u",
                "uma-vllm@{engine}.service",
                "-o",
                "short-iso",
                "--no-pager",
                "-q",
                "-n",
                "{lines}",
            ],
        ),
        journal_dir=dict(type="path"),
        kernel_commands=dict(
            type="list",
            elements="list",
            default=[
                ["journalctl", "-k", "-o", "short-iso", "--no-pager", "-q", "-n", "{lines}"],
                ["dmesg", "--time-format", "iso"],
            ],
        ),
        kernel_log_file=dict(type="path"),
        lines=dict(type="raw", default=20000),
        metrics_urls=dict(type="dict", default={}),
        metrics_timeout=dict(type="raw", default=5),
        cache_fraction=dict(type="raw", default=0.15),
        kv_usage_high=dict(type="raw", default=0.9),
        report_host=dict(type="str"),
        timeline_name=dict(type="str", default="{host}-{engine}.svg"),
    )


def run_module():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    try:
        lines, timeout, settings = node.checked_request(p)
        result = node.diagnose_node(p, lines, timeout, settings)
    except UmaError as err:
        module.fail_json(msg=err.message)
    module.exit_json(changed=False, **result)


def main():
    run_module()


if __name__ == "__main__":
    main()
