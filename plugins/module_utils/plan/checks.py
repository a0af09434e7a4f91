# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner's input checks: option types and limits, the model config's types, the
parallel layout vLLM accepts, dtypes, and the extra argv words (issue 10's bad-input
harness). Each check raises ``UmaError`` naming the option, the value and the fix;
``_vllm_plan_inputs`` calls them in a fixed order. Pure stdlib, imports under Python 3.8.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.checks import SECRET_ENV_RE, SECRET_FLAGS
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, require_int
from ansible_collections.uma.vllm.plugins.module_utils.plan import model as model_mod
from ansible_collections.uma.vllm.plugins.module_utils.plan import versions

# --- input validation ------------------------------------------------------------


def _opt_int(params: Dict[str, Any], name: str, default: Optional[int], minimum: int = 1) -> Optional[int]:
    value = params.get(name)
    if value is None:
        return default
    return require_int(name, value, minimum=minimum)


def _opt_float(params: Dict[str, Any], name: str, minimum: float = 0.0, allow_zero: bool = True) -> Optional[float]:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        raise UmaError(name, value, "is a boolean, not a number", "Give a number.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UmaError(name, value, "is not a number", "Give a number such as 128 or 0.5.") from None
    if math.isnan(number) or math.isinf(number):
        raise UmaError(name, value, "is not a finite number", "Give a finite number.")
    if number < minimum or (not allow_zero and number == 0):
        raise UmaError(
            name, value, "must be %s %s" % (">=" if allow_zero else ">", minimum), "Give a non-negative size."
        )
    return number


def _bool(params: Dict[str, Any], name: str, default: bool) -> bool:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return value.lower() in ("true", "yes", "1", "on")
    raise UmaError(name, value, "is not a boolean", "Give true or false.")


# --- the parallel layout and the dtypes ----------------------------------------------


def _validate_parallel(desc: Dict[str, Any], tp: int, pp: int) -> None:
    """The refusals vLLM raises for TP/PP (ModelConfig.verify_with_parallel_config,
    QKVParallelLinear, vllm.distributed.utils.divide)."""
    heads = desc["num_heads"]
    if heads % tp:
        raise UmaError(
            "tensor_parallel_size",
            tp,
            "the model's %d attention heads are not divisible by it (vLLM refuses: "
            "'Total number of attention heads must be divisible by tensor parallel size')" % heads,
            "Use a tensor_parallel_size that divides %d." % heads,
        )
    kv = desc["num_kv_heads"]
    if not desc["mla"] and ((kv >= tp and kv % tp) or (kv < tp and tp % kv)):
        raise UmaError(
            "tensor_parallel_size",
            tp,
            "the model's %d KV heads can neither be split nor replicated evenly over it" % kv,
            "Use a tensor_parallel_size that divides %d or is a multiple of it." % kv,
        )
    state = desc["state"]
    if state is not None:
        heads_name = "linear_num_value_heads" if state["family"] == "gated_delta_net" else "mamba_num_heads"
        count = state["num_v_heads"] if state["family"] == "gated_delta_net" else state["num_heads"]
        if count % tp:
            raise UmaError(
                "tensor_parallel_size",
                tp,
                "the model's %d %s are not divisible by it (vLLM's divide() asserts)" % (count, heads_name),
                "Use a tensor_parallel_size that divides %d." % count,
            )
    if pp > desc["num_layers"]:
        raise UmaError(
            "pipeline_parallel_size",
            pp,
            "is larger than the model's %d layers" % desc["num_layers"],
            "Use at most %d pipeline stages." % desc["num_layers"],
        )


def _kv_dtype(name: Any, version: versions.Version, model_bytes: int) -> int:
    if not isinstance(name, str) or name not in versions.KV_CACHE_DTYPES:
        raise UmaError(
            "kv_cache_dtype",
            name,
            "is not a KV cache dtype the planner can size",
            "Use one of: %s." % ", ".join(versions.KV_CACHE_DTYPES),
        )
    since, size = versions.KV_CACHE_DTYPES[name]
    if version < since:
        raise UmaError(
            "kv_cache_dtype",
            name,
            "is not accepted by vLLM %s (from %s on)" % (versions.vstr(version), versions.vstr(since)),
            "Use 'auto' or 'fp8', or target a newer vLLM.",
        )
    return model_bytes if size is None else size


def _resolve_dtype(option_value: Any, desc: Dict[str, Any]) -> Tuple[str, int]:
    """ModelConfig dtype 'auto': the checkpoint dtype, float32 checkpoints run as
    bfloat16 on CUDA (_resolve_auto_dtype / _get_and_verify_dtype)."""
    name = option_value or "auto"
    if name == "auto":
        name = desc["dtype"]
        if name in ("float32", "float", "fp32"):
            name = "bfloat16"
    if name not in model_mod.DTYPE_BYTES:
        raise UmaError(
            "dtype", option_value, "is not a model dtype vLLM accepts", "Use auto, bfloat16, float16 or float32."
        )
    return name, model_mod.DTYPE_BYTES[name]


def _state_dtype_bytes(value: Any, option: str, fallback: int) -> int:
    if value in (None, "auto"):
        return fallback
    if value not in ("float32", "float16", "bfloat16"):
        raise UmaError(option, value, "is not a mamba state dtype", "Use auto, float32, float16 or bfloat16.")
    return model_mod.DTYPE_BYTES[value]


def _extra_args(params: Dict[str, Any], version: versions.Version, warnings: List[str]) -> List[str]:
    extra = params.get("extra_args") or []
    if isinstance(extra, str):
        raise UmaError("extra_args", extra, "is a string, not a list", "Give one list item per argv word.")
    if not isinstance(extra, list):
        raise UmaError("extra_args", extra, "is not a list", "Give a list such as ['--enforce-eager'].")
    for item in extra:
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise UmaError("extra_args", item, "is not an argv word", "Give strings such as '--enforce-eager'.")
    words = [str(x) for x in extra]
    owned = tuple(versions.PLANNED_FLAGS) + OWNED_FLAGS
    for word in words:
        if any(c in word for c in "\x00\n\r"):
            raise UmaError("extra_args", word, "contains a NUL or line break", "Give one plain argv word per item.")
        if not word.startswith("-"):
            continue
        if " " in word.split("=", 1)[0] or "\t" in word.split("=", 1)[0]:
            raise UmaError("extra_args", word, "has a space inside a flag", "Give one list item per argv word.")
        flag = canonical_flag(word)
        if flag in SECRET_FLAGS:
            raise UmaError(
                "extra_args",
                flag,
                "puts a secret on the command line (seen in ps, the journal and the 0644 engine config)",
                "Drop it and give the value as the secret %s (vllm_service_engines[].secrets), which vLLM reads "
                "from the 0600 EnvironmentFile." % SECRET_FLAGS[flag],
            )
        abbreviates = flag.startswith("--") and len(flag) > 4 and any(o.startswith(flag) for o in owned)
        if flag in owned or abbreviates:
            planned = flag if flag in owned else next(o for o in owned if o.startswith(flag))
            raise UmaError(
                "extra_args",
                word,
                "sets %s, a flag the planner computes (any spelling: -, _, =value, abbreviation)" % planned,
                "Give the value through the module option instead (%s)." % planned[2:].replace("-", "_"),
            )
        supported = versions.flag_supported(flag, version)
        if supported is False:
            raise UmaError(
                "extra_args",
                word,
                "is rejected by vLLM %s (%s exists in %s)"
                % (versions.vstr(version), flag, versions.flag_range_text(flag)),
                "Drop it or target a vLLM release that has it.",
            )
        if supported is None:
            warnings.append("extra_args flag %s is not in the planner's flag table; passed through unchecked" % flag)
    return words


# --- input validation (bad-input harness, issue 10) ---------------------------------------

# Flags the planner owns besides PLANNED_FLAGS: the model and the dtypes it sizes with.
OWNED_FLAGS = ("--model", "--dtype", "--mamba-cache-mode", "--mamba-cache-dtype", "--mamba-ssm-cache-dtype")
_ADDR_RE = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,253}", re.ASCII)

INT_LIMITS = {
    # option: (minimum, maximum)
    "weights_bytes": (0, 1 << 50),
    "tensor_parallel_size": (1, 4096),
    "pipeline_parallel_size": (1, 4096),
    "data_parallel_size": (1, 4096),
    "data_parallel_size_local": (1, 4096),
    "data_parallel_rpc_port": (1, 65535),
    "data_parallel_start_rank": (0, 4095),
    "nnodes": (1, 4096),
    "node_rank": (0, 4095),
    "master_port": (1, 65535),
    "max_model_len": (1, 1 << 31),
    "max_num_seqs": (1, 1 << 20),
    "max_num_batched_tokens": (1, 1 << 24),
    "block_size": (1, 1 << 16),
    "kv_cache_memory_bytes": (1 << 20, 1 << 50),  # below 1 MiB no KV block of any model fits
    # the node's kernel settings for the MemAvailable model (_memavail): the kernel's own ranges
    "min_free_kbytes": (1, 1 << 40),
    "watermark_scale_factor": (1, 3000),
}
FLOAT_LIMITS = {
    "total_memory_gib": 1 << 20,
    "reserve_gib": 1 << 20,
    "activation_reserve_gib": 1 << 20,
    "node_baseline_gib": 1 << 20,
    "other_engines_gib": 1 << 20,
}
CONFIG_INT_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "num_experts_per_tok",
    "experts_per_token",
    "moe_topk",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "sliding_window",
    "sliding_window_pattern",
    "max_window_layers",
    "full_attention_interval",
    "max_position_embeddings",
    "vocab_size",
    "num_experts",
    "n_routed_experts",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
CONFIG_SUBS = ("text_config", "llm_config", "language_config", "thinker_config")


def canonical_flag(word: str) -> str:
    """The flag an argv word sets, as vLLM's parser reads it: ``--max_model_len=1`` -> ``--max-model-len``."""
    flag = word.split("=", 1)[0]
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
    return versions.FLAG_ALIASES.get(flag, flag)


def check_scalars(params: Dict[str, Any]) -> None:
    """Bools, non-finite or absurd numbers, bad ports, addresses and contradictory pairs."""
    _check_int_limits(params)
    _check_float_limits(params)
    _check_addresses(params)
    _check_model_name(params)
    _check_data_parallel_ranks(params)
    _check_env(params)


def _check_int_limits(params: Dict[str, Any]) -> None:
    for name, (low, high) in INT_LIMITS.items():
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            raise UmaError(name, value, "is a boolean, not a whole number", "Give a whole number.")
        require_int(name, value, minimum=low, maximum=high)


def _check_float_limits(params: Dict[str, Any]) -> None:
    for name, high in FLOAT_LIMITS.items():
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            raise UmaError(name, value, "is a boolean, not a number", "Give a number.")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise UmaError(name, value, "is not a number", "Give a number such as 12 or 0.5.") from None
        if not math.isfinite(number) or number > high:
            raise UmaError(name, value, "is not a finite number <= %g" % high, "Give a realistic value.")


def _check_addresses(params: Dict[str, Any]) -> None:
    for name in ("master_addr", "data_parallel_address"):
        value = params.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not _ADDR_RE.fullmatch(value):
            raise UmaError(
                name,
                value,
                "is not a host name or IP address (letters, digits, . : - _ [ ] %; no spaces)",
                "Give e.g. 10.0.0.1 or node1.",
            )


def _check_model_name(params: Dict[str, Any]) -> None:
    model = params.get("model")
    if model is not None and (
        not isinstance(model, str) or not model.strip() or model.startswith("-") or any(c.isspace() for c in model)
    ):
        raise UmaError("model", model, "is not a model name or path", "Give e.g. meta-llama/Llama-3-8B or /models/x.")


def _check_data_parallel_ranks(params: Dict[str, Any]) -> None:
    dp = params.get("data_parallel_size")
    dp = 1 if dp is None else int(dp)
    local = params.get("data_parallel_size_local")
    if local is not None and int(local) > dp:
        raise UmaError(
            "data_parallel_size_local",
            local,
            "is larger than data_parallel_size (%d)" % dp,
            "Give at most data_parallel_size engines per node.",
        )
    start = params.get("data_parallel_start_rank")
    if start is not None and int(start) >= dp:
        raise UmaError(
            "data_parallel_start_rank",
            start,
            "is not below data_parallel_size (%d)" % dp,
            "Give a start rank from 0 to data_parallel_size - 1.",
        )
    if start is not None and local is not None and int(start) + int(local) > dp:
        raise UmaError(
            "data_parallel_start_rank",
            start,
            "plus data_parallel_size_local (%s) exceeds data_parallel_size (%d)" % (local, dp),
            "Give ranks that fit in data_parallel_size.",
        )


def _check_env(params: Dict[str, Any]) -> None:
    env = params.get("env") or {}
    if isinstance(env, dict):
        for key, value in env.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise UmaError("env", key, "is not an environment variable name", "Use letters, digits and '_'.")
            if SECRET_ENV_RE.search(key):
                raise UmaError(
                    "env",
                    key,
                    "looks like a secret; env values reach the engine's 0644 config, launch records and results",
                    "Give it to the role as a secret (vllm_service_engines[].secrets: {%s: ...}), which reaches "
                    "only the engine's 0600 EnvironmentFile; the planner does not need it." % key,
                )
            if isinstance(value, (dict, list)) or (isinstance(value, str) and ("\x00" in value or "\n" in value)):
                raise UmaError(
                    "env", {key: "..."}, "has a value that is not one line of text", "Give a plain string value."
                )


def check_model_config(config: Any, option: str, depth: int = 0) -> None:
    """Types of the config keys the planner reads, before it reads them."""
    if not isinstance(config, dict):
        return
    for key in CONFIG_INT_KEYS:
        value = config.get(key)
        if value is None:
            continue
        # sizes of real models stay far below these (the largest vocabularies are ~2**18)
        limit = (1 << 31) if key in ("max_position_embeddings", "sliding_window") else (1 << 24)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
            raise UmaError(
                option,
                {key: value},
                "'%s' is not a whole number from 0 to %d (config.json holds numbers, not strings)" % (key, limit),
                "Fix the value in config.json.",
            )
    archs = config.get("architectures")
    if archs is not None and not isinstance(archs, str):
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise UmaError(option, {"architectures": archs}, "is not a list of class names", "Fix config.json.")
    for key in ("model_type", "torch_dtype", "dtype"):
        value = config.get(key)
        if value is not None and not isinstance(value, str):
            raise UmaError(option, {key: value}, "'%s' is not a string" % key, "Fix config.json.")
    layer_types = config.get("layer_types")
    if layer_types is not None and not isinstance(layer_types, str):
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise UmaError(option, {"layer_types": layer_types}, "is not a list of layer kinds", "Fix config.json.")
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads > 0 and heads % kv_heads:
        raise UmaError(
            option,
            {"num_attention_heads": heads, "num_key_value_heads": kv_heads},
            "num_key_value_heads does not divide num_attention_heads",
            "Fix config.json (grouped-query attention needs heads = groups x KV heads).",
        )
    if depth < 2:
        for key in CONFIG_SUBS:
            sub = config.get(key)
            if sub is not None and not isinstance(sub, dict):
                raise UmaError(option, {key: sub}, "'%s' is not a mapping" % key, "Fix config.json.")
            check_model_config(sub, option, depth + 1)


def _require_flag(flag: str, version: versions.Version, option: str, value: Any) -> None:
    if not versions.flag_supported(flag, version):
        raise UmaError(
            option,
            value,
            "needs %s, which vLLM %s rejects (it exists in %s)"
            % (flag, versions.vstr(version), versions.flag_range_text(flag)),
            "Target a vLLM release that has %s or drop %s." % (flag, option),
        )
