#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_files
short_description: Check and correct a set of directories, files, secret files and the node programs in one task
version_added: 0.1.0
description:
  - Makes a whole set of directories and files on the node what the play says, in one task instead of one task
    per file (a no-op run reads every path once and reports no change).
  - Directories are created in the order given (list parents first); an existing directory with another mode,
    owner or group is corrected.
  - A file whose content differs is replaced atomically - a temporary file in the same directory gets the
    content, its owner and mode, is flushed to disk and renamed over the old one - so a reader sees the old or
    the new file and a failure leaves the old one intact. A file whose only mode, owner or group differ is
    corrected in place.
  - O(secret_files) are files like O(files) whose content never appears in the result, the diff, a warning or
    an error; the diff shows only that, and by how many bytes, it changed.
  - O(programs=true) installs the collection's node programs into O(lib_dir) from the module's own payload,
    the node package as C(uma_vllm_node/) (directories C(0755)) and one entry script per program (the launcher
    C(uma_launch.py), the guard C(uma_guard.py), the watchdog C(uma_watchdog.py), the readahead restorer
    C(uma_readahead.py), the textfile collector C(uma_metrics.py)), files mode C(0644), owned by root.
  - Every entry is validated and the node is read before anything is touched; a refusal names the option with
    its index (for example C(files[2].mode)), the value and the fix, and leaves the node as it was.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.NODE
options:
  directories:
    description:
      - Directories to create or correct, in this order. A path that exists and is not a directory is refused.
      - Symbolic links to directories are followed.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path, without C(..), doubled or trailing C(/). Its parent must exist or be listed earlier.
        type: str
        required: true
      mode:
        description: Mode as an octal string of 3 or 4 digits (quote it in YAML). A number is refused.
        type: raw
        default: "0755"
      owner:
        description: User name (or numeric uid) that exists on the node.
        type: str
        default: root
      group:
        description: Group name (or numeric gid) that exists on the node.
        type: str
        default: root
  files:
    description:
      - Regular files with their full content. The parent directory must exist or be listed in O(directories).
      - A symbolic link, a directory or another kind of file at the path is refused.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path, without C(..), doubled or trailing C(/).
        type: str
        required: true
      content:
        description: The file's full content (written as UTF-8).
        type: str
        required: true
      mode:
        description: Mode as an octal string of 3 or 4 digits (quote it in YAML). A number is refused.
        type: raw
        default: "0644"
      owner:
        description: User name (or numeric uid) that exists on the node.
        type: str
        default: root
      group:
        description: Group name (or numeric gid) that exists on the node.
        type: str
        default: root
  secret_files:
    description:
      - Like O(files), for files that hold secrets (tokens, passwords). Their content is never returned, shown in
        a diff or named in an error.
      - A mode that gives others any permission is refused.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path, without C(..), doubled or trailing C(/).
        type: str
        required: true
      content:
        description: The file's full content (written as UTF-8).
        type: str
        required: true
      mode:
        description: Mode as an octal string of 3 or 4 digits, with no permission for others.
        type: raw
        default: "0600"
      owner:
        description: User name (or numeric uid) that exists on the node.
        type: str
        default: root
      group:
        description: Group name (or numeric gid) that exists on the node.
        type: str
        default: root
  programs:
    description:
      - Install the node programs into O(lib_dir) (the package C(uma_vllm_node/) and the entry scripts; files
        C(0644), directories C(0755), root:root); O(lib_dir) is created C(0755) when missing, unless it is listed
        in O(directories).
    type: bool
    default: false
  lib_dir:
    description: Where O(programs=true) installs the programs.
    type: path
    default: /usr/local/lib/uma-vllm
notes:
  - The checksums returned are the sha1 of the content, the value M(ansible.builtin.stat) returns as C(checksum).
  - Ansible hides every value of a secret file's content in the task's output; a very short secret (a few
    characters) is therefore also masked wherever those characters appear in the output.
  - SELinux contexts and file attributes (C(chattr)) are not managed.
seealso:
  - module: ansible.builtin.file
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: An engine's directories, files, secret file and the node programs, in one task
  uma.vllm.node_files:
    directories:
      - path: /etc/uma-vllm
      - path: /etc/uma-vllm/engines
        mode: "0750"
    files:
      - path: /etc/uma-vllm/engines/llama.json
        content: "{{ engine_config | to_nice_json }}\n"
    secret_files:
      - path: /etc/uma-vllm/engines/llama.env
        content: "HF_TOKEN={{ hf_token }}\n"
    programs: true
  become: true
  register: node_files

- name: Restart the engine when its configuration or the programs changed
  ansible.builtin.debug:
    msg: restart needed
  when: >-
    node_files.files['/etc/uma-vllm/engines/llama.json'].changed
    or node_files.programs.changed_paths | length > 0
"""

RETURN = r"""
changed_paths:
  description: Every path created, rewritten or whose mode, owner or group was corrected (predicted in check mode).
  returned: always
  type: list
  elements: str
  sample: ["/etc/uma-vllm/engines", "/etc/uma-vllm/engines/llama.json"]
files:
  description:
    - One entry per path of O(files) and O(secret_files) - the sha1 C(checksum) of the content the file has after
      the run (the same value as M(ansible.builtin.stat)'s C(checksum)), whether the run changed it and whether it
      created it.
  returned: always
  type: dict
  sample: {"/etc/uma-vllm/engines/llama.json": {"checksum": "7c4a8d09ca3762af61e59520943dc26494f8941b",
           "changed": true, "created": false}}
directories:
  description: One entry per path of O(directories) - whether the run changed it and whether it created it.
  returned: always
  type: dict
  sample: {"/etc/uma-vllm/engines": {"changed": false, "created": false}}
programs:
  description:
    - For O(programs=true), the lib dir, the paths this run wrote or corrected there (with O(lib_dir) itself when
      created), and one fingerprint over the programs' content (it changes with any program's version).
    - C(null) when O(programs=false).
  returned: always
  type: dict
  sample: {"lib_dir": "/usr/local/lib/uma-vllm", "changed_paths": [], "fingerprint": "3f0c1e2d4b5a6978"}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_files as nf
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.flow import run_module
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.module import _raw_args as raw_args
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.module import strict_module


def entry_spec(mode: str, content: bool, secret: bool = False) -> dict:
    spec = dict(
        path=dict(type="str", required=True),
        mode=dict(type="raw", default=mode),
        owner=dict(type="str", default="root"),
        group=dict(type="str", default="root"),
    )
    if content:
        spec["content"] = dict(type="str", required=True, no_log=secret)
    return dict(type="list", elements="dict", default=[], options=spec)


def refuse_bad_shapes() -> None:
    """A list option that is not a list of dictionaries, refused naming it (before ansible-core,
    whose own message for a bad element names no option)."""
    try:
        nf.check_shapes(raw_args())
    except UmaError as err:
        loose = AnsibleModule(
            argument_spec=dict(
                directories=dict(type="raw"),
                files=dict(type="raw"),
                secret_files=dict(type="raw", no_log=True),
                programs=dict(type="raw"),
                lib_dir=dict(type="raw"),
            ),
            supports_check_mode=True,
        )
        loose.fail_json(msg=err.message, option=err.option)


def main() -> None:
    refuse_bad_shapes()
    module = strict_module(
        argument_spec=dict(
            directories=entry_spec(nf.DEFAULT_MODES["directories"], content=False),
            files=entry_spec(nf.DEFAULT_MODES["files"], content=True),
            # no_log on the content, not on the whole option: Ansible masks every string of a no_log
            # value wherever it appears in the output, so the secret files' paths would turn into
            # VALUE_SPECIFIED_IN_NO_LOG_PARAMETER in changed_paths, in the keys of `files` and in
            # the diff headers (and an explicit owner "root" everywhere). Hence no_log=False here.
            secret_files=dict(entry_spec(nf.DEFAULT_MODES["secret_files"], content=True, secret=True), no_log=False),
            programs=dict(type="bool", default=False),
            lib_dir=dict(type="path", default=_paths.LIB_DIR),
        ),
        supports_check_mode=True,
        # AnsibleModule logs a list option as str(list), where a multi-line secret content is escaped
        # and no longer matches the no_log value that should mask it. This default keeps the
        # invocation out of the node's journal when run without a task; under a task, the task's
        # no_log decides (ansible-core overrides this with _ansible_no_log): give secret_files only
        # from a task with no_log: true (roles/vllm_service does; molecule/cluster's canary checks).
        no_log=True,
    )
    run_module(
        module,
        lambda: nf.plan(module.params),
        nf.execute,
        nf.result,
        failed_result=nf.failed_result,
        diff=nf.diff,
    )


if __name__ == "__main__":
    main()
