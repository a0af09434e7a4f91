#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_facts
short_description: Read the vLLM engines' state on a node in one task (installed engines, watchdogs, stamps, units)
version_added: 0.1.0
description:
  - Reads, in one pass, what the role C(uma.vllm.vllm_service) needs to know about the engines already on a node
    before it decides what to remove, write and restart.
  - The engines installed on the node are those with a drop-in directory
    O(systemd_dir)C(/uma-vllm@<engine>.service.d); a regular file of that name does not count.
  - The engine watchdogs configured on the node are the files O(config_dir)C(/watchdog/<engine>.json).
  - What each running engine was started with is the JSON object in O(stamps_path).
  - The unit states of the engines in O(engines) come from one C(systemctl show -p Id -p ActiveState
    -p UnitFileState uma-vllm@<engine>.service ...); a unit systemd does not know reads as inactive.
  - Names in those directories that are not engine names (not written by the collection) are left out
    with a warning. A missing directory or stamps file is no failure, it means none.
  - Only reads; never reports a change.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.read_only
options:
  systemd_dir:
    description: Where the engines' template unit and their drop-in directories are.
    type: path
    default: /etc/systemd/system
  config_dir:
    description: The collection's configuration directory; the watchdog configs are in its C(watchdog/) directory.
    type: path
    default: /etc/uma-vllm
  stamps_path:
    description:
      - The file in which the role C(uma.vllm.vllm_service) records, per engine, the fingerprint of the files each
        engine was last started with.
      - Missing means no engine was started yet (V({})). Unreadable, not JSON or not a JSON object also reads
        as V({}), with a warning; the role then restarts the started engines, which is the safe side.
    type: path
    default: /var/lib/uma-vllm/vllm-service.json
  engines:
    description:
      - Engines whose units C(uma-vllm@<engine>.service) to read with one C(systemctl show).
      - Each name has 1-64 characters from C(A-Z a-z 0-9 _ . -) and starts with a letter or digit.
      - Empty means no C(systemctl) call and RV(units) is V({}).
    type: list
    elements: str
    default: []
  watchdog_units:
    description:
      - Also read each engine's watchdog unit C(uma-vllm-watchdog@<engine>.service), in the same C(systemctl show)
        call, into RV(watchdog_units).
    type: bool
    default: false
  files:
    description:
      - Other absolute paths to look at, into RV(files) (not followed, as C(ansible.builtin.stat)). The role
        C(uma.vllm.vllm_service) compares its firewall unit and rules file with what it would write, instead of a
        C(stat), C(copy) or C(template) task of its own on a no-op re-run.
    type: list
    elements: path
    default: []
  read:
    description:
      - Absolute paths of small files to read, into RV(contents) (at most 64 KiB each), e.g. the node's
        C(/proc/sys/net/ipv4/ip_local_port_range).
    type: list
    elements: path
    default: []
  extra_units:
    description:
      - Other systemd units (full names) to read in the same C(systemctl show) call, into RV(extra_units).
    type: list
    elements: str
    default: []
  packages:
    description:
      - Packages to look for in dpkg's status file (O(dpkg_status)), into RV(packages_missing). A name with a
        version, an architecture or a wildcard is always reported missing (the package manager decides).
    type: list
    elements: str
    default: []
  dpkg_status:
    description: dpkg's status file.
    type: path
    default: /var/lib/dpkg/status
notes:
  - C(systemctl) must be on the node when O(engines) is not empty; when it cannot run or fails, the module
    fails naming the command, its exit code and its error output.
seealso:
  - module: uma.vllm.oom_diagnose
"""

EXAMPLES = r"""
- name: Read the engines on this node, their watchdogs, stamps and unit states
  uma.vllm.engine_facts:
    engines: [llama70b, qwen7b]
  register: engines_here

- name: Engines installed but no longer wanted
  ansible.builtin.debug:
    msg: "{{ engines_here.installed | difference(['llama70b', 'qwen7b']) }}"

- name: Engines that are not running
  ansible.builtin.debug:
    msg: >-
      {{ engines_here.units | dict2items
         | rejectattr('value.ActiveState', 'in', ['active', 'activating', 'reloading'])
         | map(attribute='key') | list }}
"""

RETURN = r"""
installed:
  description: Sorted names of the engines that have a drop-in directory in O(systemd_dir).
  returned: always
  type: list
  elements: str
  sample: [llama70b, qwen7b]
watchdogs:
  description: Sorted names of the engines that have a watchdog config in O(config_dir)C(/watchdog); V([]) when
    that directory is missing.
  returned: always
  type: list
  elements: str
  sample: [llama70b]
watchdog_paths:
  description: The full paths of those watchdog configs, in the order of RV(watchdogs).
  returned: always
  type: list
  elements: str
  sample: [/etc/uma-vllm/watchdog/llama70b.json]
stamps:
  description: The JSON object in O(stamps_path); V({}) when it is missing, unreadable or not a JSON object.
  returned: always
  type: dict
  sample: {"llama70b": "3f2a.../9c1b.../None/77aa..."}
units:
  description:
    - Per engine of O(engines), what C(systemctl show -p Id -p ActiveState -p UnitFileState) returned for
      C(uma-vllm@<engine>.service); at least C(ActiveState) and C(UnitFileState).
    - 'An engine systemd does not report reads as V({"ActiveState": "inactive", "UnitFileState": ""}).'
  returned: always
  type: dict
  sample:
    llama70b: {"Id": "uma-vllm@llama70b.service", "ActiveState": "active", "UnitFileState": "enabled"}
    qwen7b: {"Id": "uma-vllm@qwen7b.service", "ActiveState": "inactive", "UnitFileState": "disabled"}
watchdog_units:
  description:
    - Per engine of O(engines), the same properties of its watchdog's unit C(uma-vllm-watchdog@<engine>.service),
      read in the same C(systemctl show) call.
  returned: when O(watchdog_units=true)
  type: dict
  sample:
    llama70b: {"Id": "uma-vllm-watchdog@llama70b.service", "ActiveState": "active", "UnitFileState": "enabled"}
systemd_dir:
  description: The O(systemd_dir) that was read.
  returned: always
  type: str
  sample: /etc/systemd/system
config_dir:
  description: The O(config_dir) that was read.
  returned: always
  type: str
  sample: /etc/uma-vllm
files:
  description:
    - Per path of O(files), what is there (not followed) -- C(exists) (a dangling symlink counts), C(kind)
      (file, link, directory, other), C(mode) (C("0644")), C(uid), C(gid) and C(sha256) of a regular file's
      content; all null but C(exists=false) where nothing is.
  returned: always
  type: dict
  sample:
    /etc/uma-vllm/firewall.nft: {"exists": true, "kind": "file", "mode": "0644", "uid": 0, "gid": 0, "sha256": "9f8..."}
contents:
  description: Per path of O(read), its text (UTF-8, invalid bytes replaced), null where it cannot be read.
  returned: always
  type: dict
  sample: {"/proc/sys/net/ipv4/ip_local_port_range": "32768\t60999\n"}
extra_units:
  description:
    - Per unit of O(extra_units), the same properties as RV(units).
    - 'A unit systemd does not know reads as V({"ActiveState": "inactive", "UnitFileState": ""}).'
  returned: always
  type: dict
  sample:
    uma-vllm-firewall.service: {"Id": "uma-vllm-firewall.service", "ActiveState": "active", "UnitFileState": "enabled"}
packages_missing:
  description: The packages of O(packages) dpkg's status does not mark installed, in their order; null where the
    status file cannot be read (not a dpkg node).
  returned: always
  type: list
  elements: str
  sample: [nftables]
stamps_path:
  description: The O(stamps_path) that was read.
  returned: always
  type: str
  sample: /var/lib/uma-vllm/vllm-service.json
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.service import engine_facts as _engine_facts


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            systemd_dir=dict(type="path", default=_engine_facts.DEFAULT_SYSTEMD_DIR),
            config_dir=dict(type="path", default=_paths.CONFIG_DIR),
            stamps_path=dict(type="path", default=_engine_facts.DEFAULT_STAMPS_PATH),
            engines=dict(type="list", elements="str", default=[]),
            watchdog_units=dict(type="bool", default=False),
            files=dict(type="list", elements="path", default=[]),
            read=dict(type="list", elements="path", default=[]),
            extra_units=dict(type="list", elements="str", default=[]),
            packages=dict(type="list", elements="str", default=[]),
            dpkg_status=dict(type="path", default="/var/lib/dpkg/status"),
        ),
        supports_check_mode=True,
    )
    try:
        result = _engine_facts.engine_facts(
            module.params,
            lambda argv: module.run_command(argv, handle_exceptions=False),
            module.get_bin_path("systemctl"),
        )
    except UmaError as err:
        module.fail_json(msg=err.message)
    for warning in result.pop("warnings", []):
        module.warn(warning)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
