#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_copy
short_description: Copy a verified model from rank 0 to the other ranks of an engine over the cluster link
version_added: 0.1.0
description:
  - The other half of M(uma.vllm.model_fetch) for a multi-node engine. Rank 0's node downloads the model from the
    Hub once and verifies it; the other ranks' nodes copy that snapshot from rank 0 over the cluster link instead
    of downloading it from the Hub themselves.
  - O(mode=serve) (rank 0) serves the verified snapshot in O(dest) read-only over HTTP, bound to O(bind) (rank 0's
    cluster address) and O(port) only, until O(peers) receivers said they are done, O(idle_s) passed without a
    request or a byte sent, or O(timeout_s) passed. Only the files its manifest (C(.uma-model-manifest.json),
    written by M(uma.vllm.model_fetch)) names are served. Run it with C(async) and C(poll=0); it never outlives
    O(timeout_s).
  - Every request carries an HMAC-SHA256 under the engine's link key (O(key_file), the 0600 file the
    C(uma.vllm.vllm_service) role delivers for the rank link) over the method, path, range, a fresh nonce and the
    time. A request with a wrong or missing MAC, an old time or a replayed nonce is refused with 401 and counted in
    RV(served).
  - O(mode=receive) (the other ranks) compares O(dest) with O(files) (names, sizes and sha256 from rank 0's
    model_fetch result, handed over by Ansible, never read from the network). A node that already holds them
    copies nothing and opens no connection. Otherwise each missing file is copied into a partial file (an
    interrupted copy resumes with an HTTP Range), its size and sha256 compared with O(files), then renamed into
    place; the manifest is written atomically last. C(config.json) is copied last, so a directory with it is whole.
  - O(mode=index) (read-only) lists a local model directory (a C(model_path) the owner put on one node), every
    file's name, size and, with O(hash=true), sha256, its C(config.json) and weight bytes (for the planner on a node
    that has no copy yet), and a digest of the list as RV(commit). O(mode=serve) with O(files) and O(commit) from
    such an index serves exactly those files (symlinks into a Hugging Face cache's C(blobs) are followed for the
    names the index holds, never for a name from the request); O(mode=receive) copies them like a snapshot.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.NODE
attributes:
  check_mode:
    details: O(mode=receive) reports what it would copy without a connection; O(mode=serve) serves nothing.
options:
  mode:
    description:
      - C(serve) on rank 0's node, C(receive) on the other ranks' nodes, C(index) on the node that has a local model
        directory to copy.
    type: str
    choices: [serve, receive, index]
    required: true
  dest:
    description:
      - The model directory (rank 0's verified snapshot for C(serve), where the copy lands for C(receive), the
        directory listed for C(index)).
    type: path
    required: true
  repo_id:
    description:
      - The model's Hugging Face id, C(OWNER/NAME) (for a local model directory, a name of it such as
        C(local/ENGINE), recorded in the copy's manifest).
      - Required with O(mode=serve) and O(mode=receive).
    type: str
  hash:
    description:
      - O(mode=index) only. Compute every file's sha256 (false lists names and sizes only, as check mode needs).
    type: bool
    default: true
  revision:
    description:
      - The revision rank 0 resolved (recorded in the manifest).
    type: str
    default: main
  commit:
    description:
      - The commit of rank 0's verified snapshot (for a local directory, RV(commit) of its index).
      - Required with O(mode=serve) and O(mode=receive).
    type: str
  key_file:
    description:
      - The engine's link key, a root-owned file of mode 0600.
      - Required with O(mode=serve) and O(mode=receive).
    type: path
  files:
    description:
      - O(mode=receive) Rank 0's files, each C({name, size, sha256}) (RV(uma.vllm.model_fetch#module:files), or
        RV(files) of an index).
      - O(mode=serve) the files of an index (RV(files)) to serve instead of a snapshot's manifest.
    type: list
    elements: dict
  source:
    description:
      - O(mode=receive) only. Rank 0's copy server, C(http://ADDRESS:PORT).
    type: str
  label:
    description:
      - How messages name rank 0, for example C(engine tp, rank 0 on spark1).
    type: str
  verify:
    description:
      - O(mode=receive) only. Hash every safetensors file already in O(dest) and compare it with O(files).
      - Files copied by this run are always checked.
    type: bool
    default: false
  bind:
    description:
      - O(mode=serve) only. The one address to listen on (rank 0's cluster address).
    type: str
  port:
    description:
      - O(mode=serve) only. The TCP port to listen on.
    type: raw
  peers:
    description:
      - O(mode=serve) only. How many receivers will say they are done.
    type: raw
    default: 1
  idle_s:
    description:
      - O(mode=serve) only. Stop after this many seconds without a request or a byte sent.
    type: float
    default: 120
  timeout_s:
    description:
      - O(mode=serve) the longest the server runs; O(mode=receive) the longest one request waits for an answer.
    type: float
    default: 3600
notes:
  - The bytes travel unencrypted over the cluster link; what lands is checked against the sha256 rank 0 computed.
seealso:
  - module: uma.vllm.model_fetch
"""

EXAMPLES = r"""
# A two-node engine "tp": rank 0 on spark1 (cluster address 192.168.100.10) downloads the model once,
# spark2 copies it from spark1 over the cluster link. The copy port is the engine's master_port + 12
# (29501 + 12 = 29513). /etc/uma-vllm/engines/tp.link.key is the engine's 0600 link key on both nodes
# (the uma.vllm.vllm_service role writes it). The uma.vllm.vllm_service role runs these steps for you.

# In a play on spark1 (rank 0):
- name: Download and verify the model once, on rank 0
  uma.vllm.model_fetch:
    repo_id: Qwen/Qwen3-0.6B
    dest: /var/lib/uma-vllm/models/Qwen/Qwen3-0.6B
  register: fetched
  become: true

- name: Serve rank 0's verified snapshot to one other rank (in the background)
  uma.vllm.model_copy:
    mode: serve
    dest: /var/lib/uma-vllm/models/Qwen/Qwen3-0.6B
    repo_id: Qwen/Qwen3-0.6B
    commit: "{{ fetched.commit }}"
    key_file: /etc/uma-vllm/engines/tp.link.key
    bind: 192.168.100.10
    port: 29513
    peers: 1
  async: 3700
  poll: 0
  register: copy_server
  become: true

# In the next play, on spark2 (the other rank): what to copy comes from rank 0's result, not the network
- name: Copy it on the other rank and verify it
  uma.vllm.model_copy:
    mode: receive
    dest: /var/lib/uma-vllm/models/Qwen/Qwen3-0.6B
    repo_id: Qwen/Qwen3-0.6B
    commit: "{{ hostvars['spark1'].fetched.commit }}"
    files: "{{ hostvars['spark1'].fetched.files }}"
    source: http://192.168.100.10:29513
    key_file: /etc/uma-vllm/engines/tp.link.key
  become: true

# In a last play, on spark1: the server stops once the other rank said it is done
- name: Wait until rank 0's copy server has stopped
  ansible.builtin.async_status:
    jid: "{{ copy_server.ansible_job_id }}"
  register: copy_served
  until: copy_served.finished
  retries: 60
  delay: 5
  become: true

# A model the owner put on spark1 only (/models/my-model): index it there, serve that index, copy it on spark2
- name: Index the local model directory on spark1
  uma.vllm.model_copy:
    mode: index
    dest: /models/my-model
  register: indexed
  become: true
"""

RETURN = r"""
commit:
  description: The commit of the snapshot; O(mode=index) the sha256 of the list of names, sizes and sha256 (null
    with O(hash=false)).
  returned: always
  type: str
  sample: c1899de289a04d12100db370d81485cdf75e47ca
bytes:
  description: O(mode=index) the bytes of every file listed.
  returned: mode is index
  type: int
  sample: 1073815552
config:
  description: O(mode=index) the directory's config.json.
  returned: mode is index
  type: dict
  sample: {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048}
weights_bytes:
  description: O(mode=index) the bytes of the safetensors weights (the planner's weights_bytes).
  returned: mode is index
  type: int
  sample: 1073741824
dest:
  description: The model directory.
  returned: always
  type: str
  sample: /var/lib/uma-vllm/models/Qwen/Qwen3-0.6B
files:
  description: O(mode=receive) the expected files with their size and sha256; O(mode=index) the directory's files
    (sha256 null with O(hash=false)).
  returned: mode is receive or mode is index
  type: list
  elements: dict
  sample: [{"name": "model.safetensors", "size": 1503300328, "sha256": "f47f71..."}]
copy:
  description: O(mode=receive) the files that were (or in check mode would be) copied, their bytes, whether a copy
    ran, the files copied and the partial files resumed (name -> bytes kept).
  returned: mode is receive
  type: dict
  sample: {"files": ["model.safetensors"], "bytes": 1503300328, "done": true, "copied": ["model.safetensors"],
           "resumed": {}}
verified:
  description: O(mode=receive) the safetensors files O(verify=true) hashed.
  returned: mode is receive
  type: list
  elements: str
  sample: ["model.safetensors"]
served:
  description: O(mode=serve) what the server did - requests, bytes and files sent, receivers done, refused
    requests, why it stopped (C(peers done), C(idle), C(timeout)) and how long it ran.
  returned: mode is serve
  type: dict
  sample: {"requests": 4, "bytes": 1503300328, "files": 3, "done_ok": 1, "done_failed": 0, "refused": 0,
           "stopped": "peers done", "peers": 1, "seconds": 7.2, "said": []}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.models import copy as mc
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan import model as pm
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.flow import run_module


def _os_problem(err: OSError) -> UmaError:
    where = err.filename or "dest"
    return UmaError("dest", str(where), "cannot be used (%s)" % (err.strerror or err), "Fix the path or its rights.")


def _serve(module: AnsibleModule) -> None:
    params = module.params
    said = []

    def say(line: str) -> None:  # a refused request: into the node's journal and the result
        said.append(line)
        module.log(line)

    try:
        request = mc.validate_serve(params)
        if module.check_mode:
            module.exit_json(changed=False, commit=request.commit, dest=request.root, served={})
        served = dict(mc.serve(request, say), said=said[-20:])
    except UmaError as err:
        module.fail_json(msg=err.message)
    except OSError as err:
        module.fail_json(msg=_os_problem(err).message)
    module.exit_json(changed=False, commit=request.commit, dest=request.root, served=served)


def _index(module: AnsibleModule) -> None:
    """Read-only: the files of a local model directory (and, for the planner on a node that has no copy
    yet, its config.json and weight bytes)."""
    try:
        found = mc.index(module.params["dest"], hashed=module.params["hash"])
        read = pm.read_model_dir(found["dest"])
    except UmaError as err:
        module.fail_json(msg=err.message)
    except OSError as err:
        module.fail_json(msg=_os_problem(err).message)
    module.exit_json(changed=False, config=read["config"], weights_bytes=read["weights_bytes"], **found)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", required=True, choices=["serve", "receive", "index"]),
            dest=dict(type="path", required=True),
            repo_id=dict(type="str"),
            hash=dict(type="bool", default=True),
            revision=dict(type="str", default="main"),
            commit=dict(type="str"),
            key_file=dict(type="path", no_log=False),
            files=dict(type="list", elements="dict"),
            source=dict(type="str"),
            label=dict(type="str"),
            verify=dict(type="bool", default=False),
            bind=dict(type="str"),
            port=dict(type="raw"),
            peers=dict(type="raw", default=1),
            idle_s=dict(type="float", default=120),
            timeout_s=dict(type="float", default=3600),
        ),
        required_if=[
            ("mode", "serve", ("repo_id", "commit", "key_file", "bind", "port")),
            ("mode", "receive", ("repo_id", "commit", "key_file", "files", "source")),
        ],
        supports_check_mode=True,
    )
    if module.params["mode"] == "serve":
        _serve(module)
        return
    if module.params["mode"] == "index":
        _index(module)
        return
    params = dict(module.params, timeout_s=min(module.params["timeout_s"], 3600.0))
    run_module(
        module,
        lambda: mc.plan_receive(mc.validate_receive(params)),
        mc.execute_receive,
        mc.result_receive,
        diff=mc.diff_receive,
        translate=(OSError, _os_problem),
    )


if __name__ == "__main__":
    main()
