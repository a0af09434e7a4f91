#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_fetch
short_description: Download a model from the Hugging Face Hub into a directory, check the disk first, verify the shards
version_added: 0.1.0
description:
  - Resolves O(revision) of the model O(repo_id) to a commit on the Hub (the real Hugging Face Hub, a mirror, or
    the lab's stand-in through O(endpoint)) and downloads the files that match O(allow_patterns) into O(dest)
    with the module's own Hub client (Python's standard library, nothing to install on the node; O(client)); an
    interrupted download resumes.
  - Before any byte is written, the sizes of the files still to download (from the Hub's file listing) are
    compared with the free space of the filesystem of O(dest); too little space fails naming O(dest), what is
    needed and what is free.
  - After the download every file's size and sha256 is compared with the Hub's listing (the LFS sha256 of each
    safetensors file), and a manifest C(.uma-model-manifest.json) (repository, commit, every file with its size
    and sha256) is written atomically into O(dest).
  - A second run with the same commit and complete files changes nothing. A new commit of the revision, a
    missing file or a file of the wrong size downloads again (a file of the wrong size is replaced).
  - O(verify=true) hashes every safetensors file already in O(dest) and fails naming the file whose sha256
    differs from the manifest or from the Hub's LFS sha256.
  - The token of a gated or private model is read from O(token_file) (mode 0600) into the module's memory and
    handed to the client; it never appears in argv, a result or a message.
  - Every option is validated before anything is touched; a refusal names the option, the value and the fix.
  - In check mode nothing is written in O(dest); the model's C(config.json) and the listed bytes of its safetensors
    are returned (RV(config), RV(weights_bytes)) so that an engine can be planned before its model is downloaded.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.NODE
options:
  repo_id:
    description:
      - The model's Hugging Face id, C(OWNER/NAME) (letters, digits, C(-), C(_), C(.); at most 96 characters).
    type: str
    required: true
  revision:
    description:
      - A branch, a tag or a commit sha. The commit it resolves to is returned as RV(commit).
    type: str
    default: main
  dest:
    description:
      - Absolute path of the directory that receives the model (created when missing).
    type: path
    required: true
  token_file:
    description:
      - Path of a file on the node that holds the Hugging Face access token (C(HF_TOKEN)) alone, mode 0600.
      - Needed for gated and private models. Without it no token is sent, even when the node's environment has
        one.
    type: path
  endpoint:
    description:
      - Base URL of the Hub, for a mirror or the lab's stand-in (C(lab/hub_standin.py)).
      - Default (unset) the real Hub, C(https://huggingface.co).
    type: str
  allow_patterns:
    description:
      - Glob patterns of the repository's files to download.
      - Default the safetensors weights and their index, C(config.json), C(generation_config.json) and the
        tokenizer files (C(tokenizer.json), C(tokenizer_config.json), C(tokenizer.model),
        C(special_tokens_map.json), C(vocab.json), C(merges.txt), C(added_tokens.json),
        C(preprocessor_config.json), C(chat_template.jinja), C(chat_template.json)).
    type: list
    elements: str
  client:
    description:
      - V(builtin) downloads with the module's own client (Python's C(urllib); the token goes to the O(endpoint)'s
        own host only, not to the CDN a file is redirected to; 4 files at a time; partial files under
        O(dest)C(/.cache/uma-hub) resume with a C(Range) request; lost connections, 5xx and 429 answers are tried
        again 4 times).
      - V(huggingface_hub) uses the node's C(huggingface_hub) package (C(snapshot_download)), which must be installed
        in the Python Ansible uses on the node (0.23 or later).
    type: str
    choices: [builtin, huggingface_hub]
    default: builtin
  verify:
    description:
      - Hash every safetensors file already in O(dest) and compare it with the manifest and the Hub's LFS
        sha256; a difference fails naming the file.
      - Files downloaded by this run are always checked.
    type: bool
    default: false
notes:
  - Needs nothing but Python on the node with the default O(client=builtin); O(client=huggingface_hub) needs that
    package in the node's Python.
  - The client keeps its partial files under O(dest)C(/.cache/uma-hub) (O(client=builtin)) or its download
    metadata and partial files under O(dest)C(/.cache/huggingface) (O(client=huggingface_hub)).
  - The free-space check counts the full size of every file still to download; a partial file from an
    interrupted run is not subtracted.
seealso:
  - module: uma.vllm.vllm_flags
"""

EXAMPLES = r"""
- name: Download Qwen3-0.6B (config, tokenizer, safetensors) into /models
  uma.vllm.model_fetch:
    repo_id: Qwen/Qwen3-0.6B
    dest: /models/Qwen3-0.6B
  become: true

- name: A gated model at a pinned commit, with the token from a 0600 file, shards verified
  uma.vllm.model_fetch:
    repo_id: meta-llama/Llama-3.1-8B-Instruct
    revision: 0e9e39f249a16976918f6564b8830bc894c89659
    dest: /models/llama-3.1-8b-instruct
    token_file: /root/.hf_token
    verify: true
  become: true

- name: From a mirror, only the weights and the config
  uma.vllm.model_fetch:
    repo_id: Qwen/Qwen3-0.6B
    dest: /models/Qwen3-0.6B
    endpoint: https://hf-mirror.example:8443
    allow_patterns: ["*.safetensors", "*.json"]
  become: true
"""

RETURN = r"""
repo_id:
  description: The model's id.
  returned: always
  type: str
  sample: Qwen/Qwen3-0.6B
revision:
  description: The requested revision.
  returned: always
  type: str
  sample: main
commit:
  description: The commit sha the revision resolved to on the Hub.
  returned: always
  type: str
  sample: c1899de289a04d12100db370d81485cdf75e47ca
dest:
  description: The directory that holds the model.
  returned: always
  type: str
  sample: /models/Qwen3-0.6B
manifest:
  description: Path of the manifest in O(dest).
  returned: always
  type: str
  sample: /models/Qwen3-0.6B/.uma-model-manifest.json
files:
  description: The files of the commit that match O(allow_patterns), their size and sha256 (C(null) until known).
  returned: always
  type: list
  elements: dict
  sample: [{"name": "model.safetensors", "size": 1503300328, "sha256": "f47f71..."}]
download:
  description: The files that were (or in check mode would be) downloaded, their total size, and whether a
    download ran.
  returned: always
  type: dict
  sample: {"files": ["model.safetensors"], "bytes": 1503300328, "done": true}
space:
  description: The free-space check - bytes needed, bytes free on the filesystem of O(dest).
  returned: always
  type: dict
  sample: {"path": "/models/Qwen3-0.6B", "need_bytes": 1503300328, "free_bytes": 812345678912}
verified:
  description: The safetensors files whose sha256 O(verify=true) checked against the manifest.
  returned: always
  type: list
  elements: str
  sample: ["model.safetensors"]
gated:
  description: Whether the Hub lists the model as gated.
  returned: always
  type: bool
  sample: false
config:
  description: In check mode, the model's config.json at the commit (the local file when it is current, else read
    from the Hub into a temporary directory that is removed; nothing is written in O(dest)), so that a plan can be
    made before the download; null otherwise or when no config.json is wanted.
  returned: always
  type: dict
  sample: {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048}
weights_bytes:
  description: In check mode, the bytes of the safetensors files wanted, as the Hub lists them; null otherwise.
  returned: always
  type: int
  sample: 1073741824
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.flow import run_module


def _os_problem(err: OSError) -> UmaError:
    where = err.filename or "dest"
    return UmaError("dest", str(where), "cannot be used (%s)" % (err.strerror or err), "Fix the path or its rights.")


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str", required=True),
            revision=dict(type="str", default="main"),
            dest=dict(type="path", required=True),
            token_file=dict(type="path", no_log=False),
            endpoint=dict(type="str"),
            allow_patterns=dict(type="list", elements="str"),
            verify=dict(type="bool", default=False),
            client=dict(type="str", default="builtin", choices=["builtin", "huggingface_hub"]),
        ),
        supports_check_mode=True,
    )
    state = {}

    def plan():
        request = mf.validate(module.params)
        state["client"] = mf.make_client(request)
        return mf.plan(request, state["client"], peek=module.check_mode)

    run_module(
        module,
        plan,
        lambda p: mf.execute(p, state["client"]),
        mf.result,
        warnings=lambda p: p.warnings,
        diff=mf.diff,
        translate=(OSError, _os_problem),
    )


if __name__ == "__main__":
    main()
