#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_flags
short_description: Plan a vLLM memory budget and emit the flags that pin it
version_added: 0.1.0
description:
  - "Predicts, before launch, the KV cache a given vLLM release builds from a memory budget
    (KV cache specs per layer, KV cache groups, blocks) and the two numbers vLLM logs at startup,
    C(GPU KV cache size: N tokens) and C(Maximum concurrency for L tokens per request: Xx)."
  - Checks that weights + KV cache + activation peak + the OS/page-cache reserve fit the memory and
    refuses, before anything is touched, with the numbers and the largest C(max_model_len) and
    C(max_num_seqs) that would fit.
  - On unified-memory machines (DGX Spark GB10, GH200, Jetson Thor) it pins the KV cache with
    C(--kv-cache-memory-bytes) and picks a C(--gpu-memory-utilization) that passes vLLM's startup
    free-memory check while the reserve stays free, so engines started together cannot steal each
    other's KV budget.
  - Emits only flags the target vLLM release parses (a version table read from vLLM's sources).
  - Models full attention with GQA (KV heads split over TP, replicated when TP exceeds them), MLA,
    sliding-window layers, hybrid models with linear-attention/mamba layers (Qwen3-Next, Qwen3.5,
    NemotronH) with vLLM's page-size unification and KV cache groups, fp8 KV cache and pipeline parallel.
  - Pure computation; it can run on the controller or on a node and changes nothing.
author:
  - uma.vllm developers (@uma-vllm)
options:
  model_path:
    description:
      - Local model directory (config.json plus safetensors shards or an index).
      - The weight size is read from the safetensors headers; weights are never loaded.
      - Mutually exclusive with O(model_config).
    type: path
  model_config:
    description:
      - The content of a Hugging Face config.json as a mapping (nested C(text_config) included).
      - Use with O(weights_bytes) when the model is not on this host.
    type: dict
  model:
    description:
      - Model argument of C(vllm serve) in the emitted argv. Defaults to O(model_path).
    type: str
  weights_bytes:
    description:
      - Checkpoint size in bytes. Read from O(model_path) when not given.
      - Required with O(model_config) when O(total_memory_gib) is given.
    type: int
  total_memory_gib:
    description:
      - Memory of one node in GiB. Unified memory this is host RAM; discrete GPUs the GPU memory.
    type: float
  reserve_gib:
    description:
      - Memory to keep free on the node in GiB (OS, page cache, vm.min_free_kbytes, other engines).
      - "Unified memory with O(total_memory_gib): when not given it is derived from the node's expected
        C(MemAvailable) at start (O(node_baseline_gib) + the watermark reserve of O(min_free_kbytes) and
        O(watermark_scale_factor), as the kernel's C(si_mem_available) computes it: high + 2 x low
        watermark + RAM/256, + O(other_engines_gib)). A given value below the part that is certain (high
        watermark + RAM/256 + a given O(node_baseline_gib) + O(other_engines_gib)) is refused with the
        numbers; one between that floor and the derived value is accepted with a warning."
      - Without O(total_memory_gib) it defaults to 0. On a discrete GPU (O(unified_memory=false)) it defaults to
        0.75 GiB, the CUDA context each process takes from the card before vLLM's startup check (523.6 to
        620 MiB measured on NVIDIA H200 and H100 machines, driver 580), so the planned
        O(gpu_memory_utilization) leaves it free; 1.5 GiB where O(env) sets C(CUDA_MODULE_LOADING=EAGER)
        (1260 MiB measured with PyTorch's kernels alone; vLLM's own were not measured, so give O(reserve_gib)
        from a measurement there).
    type: float
  min_free_kbytes:
    description:
      - The node's C(vm.min_free_kbytes) at the engine's start (unified memory).
      - Defaults to what M(uma.vllm.uma_sysctl) sizes for O(total_memory_gib) (the node_prep role applies it).
    type: int
  watermark_scale_factor:
    description: The node's C(vm.watermark_scale_factor) (kernel default 10).
    type: int
  node_baseline_gib:
    description:
      - Memory the node's OS, services and the engine's runtime outside torch hold before the engine
        asks for memory (unified memory). Default 3 GiB (an assumption; measure your node).
    type: float
  other_engines_gib:
    description:
      - Memory other engines on the node hold when this one starts (unified memory). Default 0.
    type: float
  unified_memory:
    description:
      - Whether CPU and GPU share the memory. Unified memory the KV cache is pinned with C(--kv-cache-memory-bytes).
    type: bool
    default: true
  tensor_parallel_size:
    description: Tensor parallel ranks (may span nodes, see O(nnodes)).
    type: int
    default: 1
  pipeline_parallel_size:
    description:
      - Pipeline stages; layers are split like vLLM's C(get_pp_indices) (or C(VLLM_PP_LAYER_PARTITION) in O(env)).
    type: int
    default: 1
  data_parallel_size:
    description: Data parallel engines (each has its own KV cache of the planned size).
    type: int
    default: 1
  data_parallel_size_local:
    description: Data parallel engines on this node (C(--data-parallel-size-local)).
    type: int
  data_parallel_address:
    description: Address of the data parallel head node (C(--data-parallel-address)).
    type: str
  data_parallel_rpc_port:
    description: RPC port of the data parallel head node (C(--data-parallel-rpc-port)).
    type: int
  data_parallel_start_rank:
    description: First data parallel rank on this node (C(--data-parallel-start-rank)).
    type: int
  nnodes:
    description:
      - Nodes that the tensor/pipeline parallel ranks span (vLLM >= 0.11.1, multiprocessing backend).
      - With more than one node the argv carries
        C(--distributed-executor-backend mp --nnodes --node-rank --master-addr).
    type: int
    default: 1
  node_rank:
    description: Rank of the node this argv is for; nodes other than 0 run C(--headless).
    type: int
    default: 0
  master_addr:
    description: Address of node 0; required when O(nnodes) > 1.
    type: str
  master_port:
    description: Port of the torch.distributed rendezvous on node 0.
    type: int
  headless:
    description: Add C(--headless) even on node 0 (no API server).
    type: bool
    default: false
  distributed_executor_backend:
    description: C(--distributed-executor-backend) for single-node runs (multi-node always uses C(mp)).
    type: str
    choices: [mp, ray, uni, external_launcher]
  max_model_len:
    description: Context length; defaults to the model's C(max_position_embeddings).
    type: int
  max_num_seqs:
    description: Concurrent sequences; defaults to vLLM's serve default for this memory size (256 or 1024).
    type: int
  max_num_batched_tokens:
    description: Tokens per scheduler step; defaults to vLLM's serve default for this memory size (2048, 8192 or 16384).
    type: int
  dtype:
    description: Model dtype (C(auto) follows the checkpoint; float32 checkpoints run as bfloat16).
    type: str
    default: auto
    choices: [auto, bfloat16, float16, float32]
  kv_cache_dtype:
    description:
      - KV cache dtype. C(fp8), C(fp8_e4m3), C(fp8_e5m2), C(fp8_inc) store one byte per element.
      - Refused when the target vLLM release does not accept it.
    type: str
    default: auto
  block_size:
    description:
      - KV cache block size in tokens, emitted as C(--block-size) when given.
      - Default is what vLLM picks on CUDA, 16 (64 for MLA); hybrid mamba models raise it so one
        attention page holds one mamba state, as vLLM does.
    type: int
  load_format:
    description:
      - How vLLM reads the checkpoint, emitted as C(--load-format) (C(auto) mapped safetensors, C(runai_streamer),
        C(fastsafetensors), ...). Unset, vLLM's default (C(auto)).
      - Refused, naming the release, when the target vLLM release has no such format. RV(load) says what the format
        does with the page cache and the package it needs in the image.
      - A flag the planner owns, so C(--load-format) in O(extra_args) is refused.
    type: str
  safetensors_load_strategy:
    description:
      - How the safetensors formats read each file (vLLM 0.11 and later), emitted as C(--safetensors-load-strategy).
        C(lazy) maps the file, C(eager) reads it whole into memory first.
      - Refused with a O(load_format) other than C(auto) or C(safetensors), and for a release before 0.11.
    type: str
  mamba_cache_mode:
    description:
      - Mamba state caching of hybrid models. Defaults to vLLM's (C(align) from 0.26, where prefix
        caching is on for hybrid models, else C(none)).
    type: str
    choices: [none, align]
  mamba_cache_dtype:
    description: Dtype of the mamba conv state (C(--mamba-cache-dtype), C(auto) = model dtype).
    type: str
  mamba_ssm_cache_dtype:
    description: Dtype of the mamba/GDN recurrent state (C(auto) = the model config's choice or the conv dtype).
    type: str
  kv_cache_memory_bytes:
    description:
      - Plan with exactly this KV cache budget per rank (bytes). Otherwise see O(kv_budget), at most what
        is left of O(total_memory_gib) after O(reserve_gib), weights and the activation reserve.
    type: int
  kv_budget:
    description:
      - How much KV cache to plan when O(kv_cache_memory_bytes) is not given, unified memory.
      - C(fit) claims what O(max_num_seqs) sequences of O(max_model_len) tokens need (capped by the room left),
        so engines sharing a node keep the rest; C(max) claims all the room after the reserve.
    type: str
    default: fit
    choices: [fit, max]
  gpu_memory_utilization:
    description:
      - Fraction of the device memory vLLM may use. Computed when not given.
    type: float
  activation_reserve_gib:
    description:
      - Override the estimate of activation peak + CUDA graphs + non-torch memory per rank (GiB).
      - The estimate (the larger of one C(max_num_batched_tokens) forward pass and the sampler's
        C(max_num_seqs) x vocab logits, + non-torch memory per TP rank, + 1 GiB CUDA graphs unless
        C(--enforce-eager)) is calibrated on public vLLM start-up logs; it does not model the
        encoder of a multimodal model (a warning asks for this option then).
    type: float
  vllm_version:
    description: Target vLLM release, e.g. C(0.32.0). Flags and KV arithmetic follow it.
    type: str
    default: "0.32.0"
  extra_args:
    description:
      - More argv words appended as given. Flags the planner computes are refused here; flags the
        target release is known to reject are refused; unknown flags pass with a warning.
    type: list
    elements: str
    default: []
  env:
    description:
      - Environment for the vLLM process, returned as given. C(VLLM_PP_LAYER_PARTITION) and
        C(VLLM_ALLOW_LONG_MAX_MODEL_LEN) are honoured by the plan.
    type: dict
    default: {}
extends_documentation_fragment:
  - uma.vllm.attributes
attributes:
  check_mode:
    support: full
    details: The module only computes; C(changed) is always false.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - The activation reserve is an estimate, not a mirror of vLLM's profiling; the KV cache
    numbers are exact for a given KV budget.
  - Weights are assumed to split evenly over TP x PP ranks.
seealso:
  - name: vLLM engine arguments
    description: The flags this module emits.
    link: https://docs.vllm.ai/en/latest/configuration/engine_args.html
"""

EXAMPLES = r"""
- name: Plan Llama 3 8B on a DGX Spark (128 GiB unified memory)
  uma.vllm.vllm_flags:
    model_path: /models/Meta-Llama-3-8B-Instruct
    total_memory_gib: 119.7
    reserve_gib: 12
    max_model_len: 8192
    max_num_seqs: 64
    vllm_version: "0.32.0"
  register: plan

- name: Start vLLM with the planned flags
  ansible.builtin.command:
    argv: "{{ plan.argv }}"
  environment: "{{ plan.env }}"

- name: Plan from a config only (model not on this host), fp8 KV cache, fixed KV budget
  uma.vllm.vllm_flags:
    model: Qwen/Qwen3-32B
    model_config: "{{ lookup('ansible.builtin.file', 'qwen3-32b/config.json') | from_json }}"
    weights_bytes: 65527752704
    total_memory_gib: 119.7
    reserve_gib: 10
    kv_cache_memory_bytes: 21474836480
    kv_cache_dtype: fp8
    max_model_len: 32768

- name: Two DGX Spark nodes, tensor parallel 2, argv for the worker node
  uma.vllm.vllm_flags:
    model_path: /models/Qwen3-Next-80B-A3B-Instruct
    total_memory_gib: 119.7
    reserve_gib: 12
    tensor_parallel_size: 2
    nnodes: 2
    node_rank: 1
    master_addr: 10.0.0.1
    master_port: 29501
    max_model_len: 65536
"""

RETURN = r"""
argv:
  description: The command line, starting with C(vllm serve MODEL).
  returned: success
  type: list
  elements: str
  sample: ["vllm", "serve", "/models/llama", "--tensor-parallel-size", "1", "--max-model-len", "8192",
           "--max-num-seqs", "64", "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.874",
           "--kv-cache-memory-bytes", "87617748992"]
env:
  description: Environment for the vLLM process.
  returned: success
  type: dict
  sample: {"VLLM_PP_LAYER_PARTITION": "14,13"}
budget:
  description: The computed budget (bytes per rank unless noted).
  returned: success, and on refusal with the numbers computed so far
  type: dict
  contains:
    weights_bytes:
      description: Checkpoint size.
      type: int
    kv_cache_bytes:
      description: KV cache budget per rank (what C(--kv-cache-memory-bytes) carries).
      type: int
    bytes_per_token:
      description: KV bytes per token per rank of the layers whose cache grows with the sequence.
      type: int
    num_blocks:
      description: KV cache blocks vLLM will allocate.
      type: int
    kv_tokens:
      description: The N of vLLM's log line C(GPU KV cache size, N tokens).
      type: int
    max_concurrency:
      description: The factor vLLM logs as C(Maximum concurrency for L tokens per request).
      type: float
    activation_reserve_bytes:
      description: Reserve for activations, CUDA graphs and non-torch memory per rank.
      type: int
    reserve_bytes:
      description: Memory kept free per node.
      type: int
    reserve_source:
      description: Where the reserve came from (derived from the MemAvailable model, or reserve_gib vs that model).
      type: str
    expected_available_bytes:
      description: Unified memory, the node's modelled MemAvailable at the engine's start.
      type: int
    gpu_memory_utilization:
      description: The fraction emitted (or given).
      type: float
    kv_needed_bytes:
      description: KV cache one C(max_model_len) request needs, as vLLM's startup check computes it.
      type: int
    largest_max_model_len:
      description: On refusal, the largest C(max_model_len) that fits.
      type: int
    largest_max_num_seqs:
      description: On refusal, how many full-length sequences fit at that length.
      type: int
  sample: {"kv_tokens": 188512, "max_concurrency": 5.7534, "num_blocks": 11782, "bytes_per_token": 28672}
expected_log:
  description: The KV cache lines vLLM is expected to print.
  returned: success
  type: list
  elements: str
  sample: ["GPU KV cache size: 188,512 tokens", "Maximum concurrency for 32,768 tokens per request: 5.75x"]
load:
  description: How the engine reads the checkpoint, from O(load_format) and O(safetensors_load_strategy).
  returned: success
  type: dict
  contains:
    format:
      description: The load format (C(auto) when unset).
      type: str
    strategy:
      description: The safetensors load strategy given, or null (vLLM's default).
      type: str
    page_cache:
      description:
        - What the load does with the page cache, C(mapped) (the checkpoint is mapped and read through it while
          weights load), C(read) (each file is read whole first) or C(own) (the format reads with its own buffers).
      type: str
    package:
      description: The Python package (import name) the image must hold for the format, or null.
      type: str
    gpu:
      description: Whether the format reads onto a CUDA device (it fails without one).
      type: bool
  sample: {"format": "auto", "strategy": null, "page_cache": "mapped", "package": null, "gpu": false}
model:
  description: What the planner read from the model config.
  returned: success
  type: dict
  sample: {"architecture": "LlamaForCausalLM", "layer_kinds": {"full": 32}, "dtype": "bfloat16"}
msg:
  description: Human-readable budget table.
  returned: always
  type: str
"""


from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan.planner import PlanRefused, plan
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.module import strict_module

ARGUMENT_SPEC = dict(
    model_path=dict(type="path"),
    model_config=dict(type="dict"),
    model=dict(type="str"),
    weights_bytes=dict(type="int"),
    total_memory_gib=dict(type="float"),
    reserve_gib=dict(type="float"),
    min_free_kbytes=dict(type="int"),
    watermark_scale_factor=dict(type="int"),
    node_baseline_gib=dict(type="float"),
    other_engines_gib=dict(type="float"),
    unified_memory=dict(type="bool", default=True),
    tensor_parallel_size=dict(type="int", default=1),
    pipeline_parallel_size=dict(type="int", default=1),
    data_parallel_size=dict(type="int", default=1),
    data_parallel_size_local=dict(type="int"),
    data_parallel_address=dict(type="str"),
    data_parallel_rpc_port=dict(type="int"),
    data_parallel_start_rank=dict(type="int"),
    nnodes=dict(type="int", default=1),
    node_rank=dict(type="int", default=0),
    master_addr=dict(type="str"),
    master_port=dict(type="int"),
    headless=dict(type="bool", default=False),
    distributed_executor_backend=dict(type="str", choices=["mp", "ray", "uni", "external_launcher"]),
    max_model_len=dict(type="int"),
    max_num_seqs=dict(type="int"),
    max_num_batched_tokens=dict(type="int", no_log=False),
    dtype=dict(type="str", default="auto", choices=["auto", "bfloat16", "float16", "float32"]),
    kv_cache_dtype=dict(type="str", default="auto"),
    block_size=dict(type="int"),
    load_format=dict(type="str"),
    safetensors_load_strategy=dict(type="str"),
    mamba_cache_mode=dict(type="str", choices=["none", "align"]),
    mamba_cache_dtype=dict(type="str"),
    mamba_ssm_cache_dtype=dict(type="str"),
    kv_cache_memory_bytes=dict(type="int"),
    kv_budget=dict(type="str", default="fit", choices=["fit", "max"]),
    gpu_memory_utilization=dict(type="float"),
    activation_reserve_gib=dict(type="float"),
    vllm_version=dict(type="str", default="0.32.0"),
    extra_args=dict(type="list", elements="str", default=[]),
    env=dict(type="dict", default={}),
)


def run_module():
    module = strict_module(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("model_path", "model_config")],
        required_one_of=[("model_path", "model_config")],
        supports_check_mode=True,
    )
    try:
        result = plan(dict(module.params))
    except PlanRefused as err:
        module.fail_json(msg=err.message, budget=err.details, changed=False)
    except UmaError as err:
        module.fail_json(msg=err.message, changed=False)
    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(changed=False, **result)


def main():
    run_module()


if __name__ == "__main__":
    main()
