# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Resolve a plan's inputs: validate every option, read the model, and fill a
``PlanContext`` step by step. Nothing is touched. The steps run in a fixed order, so
that of several bad options the same one is named first every time.
Pure stdlib, imports under Python 3.8.
"""

from __future__ import annotations

from typing import Any, Dict

from ansible_collections.uma.vllm.plugins.module_utils.node.base import memavail as _memavail
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan import model as model_mod
from ansible_collections.uma.vllm.plugins.module_utils.plan import versions
from ansible_collections.uma.vllm.plugins.module_utils.plan.budget import default_batching
from ansible_collections.uma.vllm.plugins.module_utils.plan.checks import (
    _bool,
    _extra_args,
    _kv_dtype,
    _opt_float,
    _opt_int,
    _require_flag,
    _resolve_dtype,
    _state_dtype_bytes,
    _validate_parallel,
    check_model_config,
    check_scalars,
)
from ansible_collections.uma.vllm.plugins.module_utils.plan.context import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MLA_BLOCK_SIZE,
    GIB,
    MAMBA_CACHE_MODES,
    PlanContext,
    gib,
)

# a config.json that breaks describe_model in one of these ways is reported as unreadable
_CONFIG_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError)


def resolve_inputs(params: Dict[str, Any]) -> PlanContext:
    """Validate every option and read the model; nothing is touched."""
    ctx = PlanContext(params=params)
    _resolve_version(ctx)
    _read_model(ctx)
    check_scalars(params)
    _resolve_parallel(ctx)
    _resolve_dtypes(ctx)
    _resolve_block_size(ctx)
    _resolve_env(ctx)
    _resolve_memory(ctx)
    _resolve_max_model_len(ctx)
    _resolve_batching(ctx)
    ctx.extra_args = _extra_args(params, ctx.version, ctx.warnings)
    _resolve_load(ctx)
    _resolve_mamba(ctx)
    _resolve_engine_switches(ctx)
    _resolve_kv_budget_options(ctx)
    return ctx


def _resolve_version(ctx: PlanContext) -> None:
    """The target vLLM release and its KV cache behaviour."""
    ctx.version_text = ctx.params.get("vllm_version") or versions.DEFAULT_VERSION
    version = versions.parse_version("vllm_version", ctx.version_text)
    ctx.version = version
    if version > versions.NEWEST_KNOWN:
        ctx.warnings.append(
            "vLLM %s is newer than the newest release the planner was read from (%s); planned like it"
            % (versions.vstr(version), versions.vstr(versions.NEWEST_KNOWN))
        )
    behaviour = versions.kv_behaviour(version)
    ctx.behaviour = behaviour
    if version < versions.V1_DEFAULT:
        ctx.warnings.append(
            "vLLM %s runs the V0 engine: planned with the uniform KV arithmetic it shares with V1 "
            "(num_gpu_blocks x block_size); V0 logs '# GPU blocks' instead of 'GPU KV cache size'"
            % versions.vstr(version)
        )
    ctx.group_size_rule = behaviour["group_size"]
    ctx.check = behaviour["check"]
    ctx.check_scope = behaviour["check_scope"]
    ctx.check_null_block = behaviour["check_null_block"]
    ctx.report = behaviour["report"]
    ctx.concurrency = behaviour["concurrency"]
    ctx.gib_format = behaviour["gib_format"]
    ctx.hybrid_align_uses_block_size = version >= (0, 20, 0)


def _read_model(ctx: PlanContext) -> None:
    """config.json (from model_path or model_config), the weights' size and the model's description."""
    params = ctx.params
    model_path = params.get("model_path")
    model_config = params.get("model_config")
    if model_path and model_config:
        raise UmaError(
            "model_config", "<given>", "is given together with model_path", "Give one of model_path or model_config."
        )
    ctx.weights_bytes = _opt_int(params, "weights_bytes", None, minimum=0)
    if model_path:
        read = model_mod.read_model_dir(model_path)
        ctx.config = read["config"]
        if ctx.weights_bytes is None:
            ctx.weights_bytes = read["weights_bytes"]
        ctx.shards = read["shards"]
    elif model_config is not None:
        ctx.config = model_config
        ctx.shards = []
    else:
        raise UmaError("model_path", None, "neither model_path nor model_config is given", "Give one of them.")
    ctx.model = params.get("model") or model_path
    ctx.desc = _describe(ctx.config, "model_path" if model_path else "model_config")


def _describe(config: Any, option: str) -> Dict[str, Any]:
    check_model_config(config, option)
    try:
        return model_mod.describe_model(config, option)
    except UmaError:
        raise
    except _CONFIG_ERRORS as err:
        raise UmaError(
            option,
            "<config.json>",
            "cannot be read as a model config (%s: %s)" % (type(err).__name__, err),
            "Give the unmodified config.json of a Hugging Face model.",
        ) from None


def _resolve_parallel(ctx: PlanContext) -> None:
    """TP, PP, DP, the nodes, and how many ranks share one node's memory."""
    params = ctx.params
    tp = ctx.tp = _opt_int(params, "tensor_parallel_size", 1)
    pp = ctx.pp = _opt_int(params, "pipeline_parallel_size", 1)
    dp = ctx.dp = _opt_int(params, "data_parallel_size", 1)
    nnodes = ctx.nnodes = _opt_int(params, "nnodes", 1)
    node_rank = ctx.node_rank = _opt_int(params, "node_rank", 0, minimum=0)
    if node_rank >= nnodes:
        raise UmaError("node_rank", node_rank, "must be below nnodes (%d)" % nnodes, "Number nodes 0 .. nnodes-1.")
    world = tp * pp
    if nnodes > 1:
        _require_flag("--nnodes", ctx.version, "nnodes", nnodes)
        if (world * dp) % nnodes:
            raise UmaError(
                "nnodes",
                nnodes,
                "does not divide the %d ranks (tp %d x pp %d x dp %d)" % (world * dp, tp, pp, dp),
                "Use a node count that divides the world size.",
            )
        if not params.get("master_addr"):
            raise UmaError("master_addr", None, "is required when nnodes > 1", "Give the address of node 0.")
    dp_local = _opt_int(params, "data_parallel_size_local", None)
    # ranks whose memory one node holds: this node's share of the TP x PP ranks,
    # times the data parallel engines running on it
    ctx.ranks_per_node = max(1, world // nnodes) * (dp_local if dp_local is not None else dp)
    _validate_parallel(ctx.desc, tp, pp)


def _resolve_dtypes(ctx: PlanContext) -> None:
    ctx.model_dtype, ctx.model_dtype_bytes = _resolve_dtype(ctx.params.get("dtype"), ctx.desc)
    ctx.kv_dtype_name = ctx.params.get("kv_cache_dtype") or "auto"
    ctx.kv_dtype_bytes = _kv_dtype(ctx.kv_dtype_name, ctx.version, ctx.model_dtype_bytes)


def _resolve_block_size(ctx: PlanContext) -> None:
    user_block_size = _opt_int(ctx.params, "block_size", None)
    if user_block_size is not None:
        allowed = versions.allowed_block_sizes(ctx.version)
        if allowed is not None and user_block_size not in allowed:
            raise UmaError(
                "block_size",
                user_block_size,
                "is not accepted by vLLM %s (--block-size choices %s)" % (versions.vstr(ctx.version), list(allowed)),
                "Use one of %s." % ", ".join(str(x) for x in allowed),
            )
    ctx.user_block_size = user_block_size
    ctx.block_size = user_block_size or (DEFAULT_MLA_BLOCK_SIZE if ctx.desc["mla"] else DEFAULT_BLOCK_SIZE)


def _resolve_env(ctx: PlanContext) -> None:
    env = ctx.params.get("env") or {}
    if not isinstance(env, dict):
        raise UmaError("env", env, "is not a mapping", "Give a dict of environment variables.")
    ctx.env = {str(k): str(v) for k, v in env.items()}


def _resolve_memory(ctx: PlanContext) -> None:
    """The node's memory, the reserve as given, and (unified memory) the startup MemAvailable model."""
    params = ctx.params
    total_gib = _opt_float(params, "total_memory_gib", allow_zero=False)
    ctx.total_bytes = int(total_gib * GIB) if total_gib is not None else None
    reserve_gib = _opt_float(params, "reserve_gib")
    ctx.reserve_bytes = int((reserve_gib or 0.0) * GIB)
    ctx.reserve_given = reserve_gib is not None
    ctx.unified = _bool(params, "unified_memory", True)
    if ctx.unified and ctx.total_bytes is not None:
        ctx.startup = _startup_model(params, ctx.total_bytes)


def _startup_model(params: Dict[str, Any], total_bytes: int) -> Dict[str, Any]:
    """Expected MemAvailable when the engine starts on a unified-memory node
    (_memavail.expected_available: the rule uma_sysctl sizes the reserve with)."""
    mfk = _opt_int(params, "min_free_kbytes", None, minimum=1)
    wsf = _opt_int(params, "watermark_scale_factor", None, minimum=1)
    baseline = _opt_float(params, "node_baseline_gib")
    others = _opt_float(params, "other_engines_gib")
    model = _memavail.expected_available(
        total_bytes,
        min_free_kbytes=mfk,
        scale_factor=wsf,
        baseline_bytes=None if baseline is None else int(baseline * GIB),
        other_engines_bytes=int((others or 0.0) * GIB),
    )
    model["reserve_bytes"] = total_bytes - model["available_bytes"]
    model["text"] = (
        "node baseline %.2f GiB (%s) + watermark reserve %.2f GiB (vm.min_free_kbytes %d from %s, "
        "watermark_scale_factor %d; kernel si_mem_available) + other engines %.2f GiB"
        % (
            gib(model["baseline_bytes"]),
            "node_baseline_gib" if model["baseline_source"] == "given" else "default",
            gib(model["watermark_reserve_bytes"]),
            model["min_free_kbytes"],
            model["min_free_kbytes_source"],
            model["watermark_scale_factor"],
            gib(model["other_engines_bytes"]),
        )
    )
    return model


def _resolve_max_model_len(ctx: PlanContext) -> None:
    max_position = ctx.desc["max_position_embeddings"]
    max_model_len = _opt_int(ctx.params, "max_model_len", None)
    if max_model_len is None:
        if max_position is None:
            raise UmaError(
                "max_model_len",
                None,
                "is not given and the config has no max_position_embeddings",
                "Give max_model_len.",
            )
        max_model_len = max_position
    elif (
        max_position is not None
        and max_model_len > max_position
        and ctx.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1"
    ):
        raise UmaError(
            "max_model_len",
            max_model_len,
            "is larger than the model's max_position_embeddings (%d); vLLM refuses it" % max_position,
            "Lower max_model_len or set env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if the model really supports it.",
        )
    ctx.max_model_len = max_model_len


def _resolve_batching(ctx: PlanContext) -> None:
    """max_num_batched_tokens / max_num_seqs: given, or vLLM's defaults for the node's memory."""
    default_mnbt, default_seqs = default_batching(
        ctx.total_bytes, ctx.unified and ctx.behaviour["gb10_small_batch_tier"]
    )
    ctx.max_num_batched_tokens = _opt_int(ctx.params, "max_num_batched_tokens", default_mnbt)
    ctx.max_num_seqs = _opt_int(ctx.params, "max_num_seqs", default_seqs)
    if ctx.max_num_batched_tokens < ctx.max_num_seqs:
        raise UmaError(
            "max_num_batched_tokens",
            ctx.max_num_batched_tokens,
            "is below max_num_seqs (%d); vLLM's SchedulerConfig refuses that" % ctx.max_num_seqs,
            "Raise max_num_batched_tokens or lower max_num_seqs.",
        )


def _mamba_mode(ctx: PlanContext) -> str:
    """Prefix caching decides the mamba cache mode (MambaModelConfig.verify_and_update_config):
    on -> 'align' (2 state blocks per request), off -> 'none'."""
    behaviour, extra = ctx.behaviour, ctx.extra_args
    given_mode = ctx.params.get("mamba_cache_mode")
    if given_mode is not None and behaviour["mamba_mode_follows_prefix_caching"]:
        ctx.warnings.append(
            "mamba_cache_mode %r is ignored by vLLM %s (--mamba-cache-mode is deprecated there; the mamba "
            "mode follows prefix caching): planned with the mode prefix caching gives"
            % (given_mode, versions.vstr(ctx.version))
        )
        given_mode = None
    mamba_mode = given_mode or behaviour["mamba_default_mode"]
    prefix_off = "--no-enable-prefix-caching" in extra or "--disable-prefix-caching" in extra
    if given_mode is None and prefix_off:
        mamba_mode = "none"
    elif given_mode is None and "--enable-prefix-caching" in extra and ctx.version >= (0, 15, 0):
        mamba_mode = "align"
    if mamba_mode not in MAMBA_CACHE_MODES:
        raise UmaError(
            "mamba_cache_mode",
            mamba_mode,
            "is not a mode the planner models",
            "Use 'none' or 'align' (the 'all' mode is not modelled).",
        )
    return mamba_mode


def _resolve_load(ctx: PlanContext) -> None:
    """load_format / safetensors_load_strategy: each known to the target release (refused naming
    it), the strategy only with a safetensors format; what the load does with the page cache."""
    params = ctx.params
    fmt = params.get("load_format")
    strategy = params.get("safetensors_load_strategy")
    row = versions.load_choice("load_format", versions.LOAD_FORMATS, fmt, ctx.version) if fmt is not None else None
    ctx.load_format = fmt
    page_cache = row["page_cache"] if row else "mapped"
    if strategy is not None:
        srow = versions.load_choice(
            "safetensors_load_strategy", versions.SAFETENSORS_LOAD_STRATEGIES, strategy, ctx.version
        )
        if fmt not in (None, "auto", "safetensors"):
            raise UmaError(
                "safetensors_load_strategy",
                strategy,
                "applies to the safetensors formats only, not load_format %s" % fmt,
                "Give load_format auto or safetensors with it, or leave it unset.",
            )
        ctx.load_strategy = strategy
        page_cache = srow["page_cache"]
    ctx.load = {
        "format": fmt or "auto",
        "strategy": ctx.load_strategy,
        "page_cache": page_cache,
        "package": row["package"] if row else None,
        "gpu": bool(row and row["gpu"]),
    }
    if ctx.load["gpu"]:
        ctx.warnings.append("load_format %s reads onto a CUDA device (vLLM's loader): every rank needs one" % fmt)


def _resolve_mamba(ctx: PlanContext) -> None:
    """The mamba cache mode and the dtypes of the recurrent state (hybrid models)."""
    mamba_mode = _mamba_mode(ctx)
    state = ctx.desc["state"]
    if state is not None and not ctx.behaviour["hybrid_state_layers"]:
        raise UmaError(
            "vllm_version",
            ctx.version_text,
            "has no V1 KV cache support for linear-attention / mamba layers (needs vLLM >= 0.10.0)",
            "Target vLLM 0.10.0 or newer for this model.",
        )
    ctx.mamba_cache_mode = mamba_mode if state is not None else "none"
    params = ctx.params
    conv_bytes = _state_dtype_bytes(params.get("mamba_cache_dtype"), "mamba_cache_dtype", ctx.model_dtype_bytes)
    ssm_default = conv_bytes
    if state is not None and state.get("ssm_dtype"):
        ssm_default = _state_dtype_bytes(state["ssm_dtype"], "model_config", conv_bytes)
    ctx.conv_state_bytes = conv_bytes
    ctx.ssm_state_bytes = _state_dtype_bytes(params.get("mamba_ssm_cache_dtype"), "mamba_ssm_cache_dtype", ssm_default)


def _resolve_engine_switches(ctx: PlanContext) -> None:
    """What the extra argv words switch: the hybrid manager, CUDA graphs; the tokens in flight."""
    ctx.hybrid_manager = ctx.behaviour["hybrid_manager"] and "--disable-hybrid-kv-cache-manager" not in ctx.extra_args
    ctx.enforce_eager = "--enforce-eager" in ctx.extra_args
    if ctx.behaviour["in_flight"] == "async_batches":
        ctx.in_flight_tokens = (ctx.pp + 1) * ctx.max_num_batched_tokens
    else:
        ctx.in_flight_tokens = ctx.max_num_batched_tokens


def _resolve_kv_budget_options(ctx: PlanContext) -> None:
    """kv_cache_memory_bytes, gpu_memory_utilization, the activation override and the budget mode."""
    params = ctx.params
    ctx.kv_cache_memory_bytes = _opt_int(params, "kv_cache_memory_bytes", None, minimum=1)
    gmu = _opt_float(params, "gpu_memory_utilization", allow_zero=False)
    if gmu is not None and gmu > 1.0:
        raise UmaError("gpu_memory_utilization", gmu, "must be in (0, 1]", "Give a fraction such as 0.85.")
    ctx.gmu = gmu
    ctx.activation_override = _opt_float(params, "activation_reserve_gib")
    config = ctx.config
    encoders = sorted(k for k in ("vision_config", "audio_config") if isinstance(config, dict) and k in config)
    if encoders and ctx.activation_override is None:
        ctx.warnings.append(
            "the model has %s: the activation reserve models the language model's forward pass and "
            "sampler only, not the encoder's profile run (a public log of Llama-3.2-11B-Vision shows "
            "36.6 GiB); measure it and give activation_reserve_gib" % " and ".join(encoders)
        )
    ctx.kv_budget_mode = params.get("kv_budget") or "fit"
    if ctx.kv_budget_mode not in ("fit", "max"):
        raise UmaError("kv_budget", ctx.kv_budget_mode, "is not a KV budget mode", "Use 'fit' or 'max'.")
