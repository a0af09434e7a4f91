# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory-budget planner for vLLM on unified-memory (and discrete) GPUs.

``plan(params)`` predicts, before anything is launched, what a given vLLM
release will do with a KV cache budget: the KV cache specs of every layer,
the KV cache groups, the number of blocks, and the two numbers vLLM logs
("GPU KV cache size: N tokens", "Maximum concurrency for L tokens per
request"). It then checks that weights + KV cache + activation peak + the
OS/page-cache reserve fit the memory, and emits a ``vllm serve`` argv that
pins the KV budget (``--kv-cache-memory-bytes``) and passes vLLM's startup
free-memory check.

The steps live in modules named for what they do:
- ``_vllm_plan_context``: units, ``PlanRefused`` and ``PlanContext`` (the typed inputs);
- ``_vllm_plan_checks``: option and config.json checks;
- ``_vllm_plan_inputs``: ``resolve_inputs`` (params -> ``PlanContext``);
- ``_vllm_plan_kv``: per-layer specs, KV cache groups, stages, the KV cache report;
- ``_vllm_plan_budget``: activations, reserve, KV budget, fit checks, gpu_memory_utilization;
- ``_vllm_plan_render``: argv, expected log lines, the budget table and the result.
The formulas mirror vLLM's Python sources; each function names the vLLM
file/function it follows. Version differences come from the tables in
``_vllm_versions``; nothing here branches on a version number directly.
This module keeps the names other code imports (``plan``, ``PlanRefused``,
``canonical_flag`` and the helpers below). Pure stdlib, imports under Python 3.8.
"""

from __future__ import annotations

from typing import Any, Dict

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan.budget import (
    FORWARD_FACTOR,
    NON_TORCH_PER_TP,
    NON_TORCH_PER_TP_V06,
    SAMPLER_BYTES_V0,
    SAMPLER_BYTES_V1,
    SAMPLER_BYTES_V1_SORT,
    activation_reserve,
    base_budget,
    check_kv_budget,
    check_node_fit,
    choose_kv_budget,
    default_batching,
    final_budget,
    footprint,
    sampler_bytes_per_element,
)
from ansible_collections.uma.vllm.plugins.module_utils.plan.checks import (
    CONFIG_INT_KEYS,
    CONFIG_SUBS,
    FLOAT_LIMITS,
    INT_LIMITS,
    OWNED_FLAGS,
    SECRET_ENV_RE,
    SECRET_FLAGS,
    canonical_flag,
    check_model_config,
    check_scalars,
)
from ansible_collections.uma.vllm.plugins.module_utils.plan.context import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MLA_BLOCK_SIZE,
    GIB,
    KERNEL_BLOCK_ALIGNMENT,
    MAMBA_CACHE_MODES,
    MIB,
    MLA_HYBRID_ALIGNMENT,
    PlanContext,
    PlanRefused,
    cdiv,
    format_gib,
    gib,
)
from ansible_collections.uma.vllm.plugins.module_utils.plan.inputs import resolve_inputs
from ansible_collections.uma.vllm.plugins.module_utils.plan.kv import (
    KvLayout,
    Spec,
    attention_page_bytes,
    blocks_per_request,
    build_groups,
    build_layer_specs,
    bytes_per_block,
    estimate_max_model_len,
    kv_cache_report,
    kv_layout,
    needed_memory,
    pp_partition,
    project_groups,
    state_page_bytes,
)
from ansible_collections.uma.vllm.plugins.module_utils.plan.render import (
    budget_table,
    build_argv,
    expected_log,
    plan_result,
)

__all__ = [
    "CONFIG_INT_KEYS",
    "CONFIG_SUBS",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MLA_BLOCK_SIZE",
    "FLOAT_LIMITS",
    "FORWARD_FACTOR",
    "GIB",
    "INT_LIMITS",
    "KERNEL_BLOCK_ALIGNMENT",
    "MAMBA_CACHE_MODES",
    "MIB",
    "MLA_HYBRID_ALIGNMENT",
    "NON_TORCH_PER_TP",
    "NON_TORCH_PER_TP_V06",
    "OWNED_FLAGS",
    "SAMPLER_BYTES_V0",
    "SAMPLER_BYTES_V1",
    "SAMPLER_BYTES_V1_SORT",
    "SECRET_ENV_RE",
    "SECRET_FLAGS",
    "KvLayout",
    "PlanContext",
    "PlanRefused",
    "Spec",
    "activation_reserve",
    "attention_page_bytes",
    "blocks_per_request",
    "budget_table",
    "build_argv",
    "build_groups",
    "build_layer_specs",
    "bytes_per_block",
    "canonical_flag",
    "cdiv",
    "check_model_config",
    "check_scalars",
    "default_batching",
    "estimate_max_model_len",
    "format_gib",
    "gib",
    "kv_cache_report",
    "needed_memory",
    "plan",
    "pp_partition",
    "project_groups",
    "resolve_inputs",
    "sampler_bytes_per_element",
    "state_page_bytes",
]


def plan(params: Dict[str, Any]) -> Dict[str, Any]:
    """Compute the budget, the KV cache prediction, argv and env; raise on refusal.

    resolve the inputs -> lay out the KV cache -> size weights, activations and the
    reserve -> choose the KV budget -> refuse what does not fit -> render argv and tables.
    """
    ctx = resolve_inputs(params)
    layout = kv_layout(ctx)
    if ctx.model is None:
        raise UmaError(
            "model", None, "is needed for argv when model_path is not given", "Give model (a path or a model id)."
        )
    fp = footprint(ctx)
    choose_kv_budget(ctx, layout, fp)
    base = base_budget(ctx, layout, fp)
    report = check_kv_budget(ctx, layout, fp, base)
    gmu = check_node_fit(ctx, layout, fp, base, report["kv_needed_bytes"])
    budget = final_budget(ctx, layout, fp, report, gmu)
    argv, argv_notes = build_argv(ctx, fp.kv_budget, gmu)
    ctx.warnings.extend(argv_notes)
    return plan_result(ctx, argv, budget, expected_log(ctx, layout, report))
