# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a model the way vLLM sees it: the layers that hold KV cache or state.

``describe_model`` turns a Hugging Face ``config.json`` (a dict, nested
``text_config`` included) into the per-layer facts the KV planner needs:
attention kind of every decoder layer, KV heads, head size, MLA latent size,
sliding window and the recurrent-state geometry of linear-attention / mamba
layers. ``read_model_dir`` reads config.json and the safetensors headers of a
local checkpoint (weights are never loaded). Pure stdlib.
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError

GIB = 1 << 30

# torch dtype name -> bytes per element (vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE)
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bf16": 2,
}

# Model types whose attention is MLA when kv_lora_rank is set
# (ModelConfig.is_deepseek_mla / use_mla in vllm/config/model.py).
MLA_MODEL_TYPES = (
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "deepseek_mtp",
    "kimi_k2",
    "kimi_vl",
    "glm4_moe_lite",
    "longcat_flash",
    "mistral_large_3",
    "pangu_ultra_moe",
)

# Gated DeltaNet hybrids (vllm/model_executor/models/qwen3_next.py, qwen3_5.py).
GDN_MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe")

LAYER_TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "global_attention": "full",
    "sliding_attention": "sliding",
    "sliding_window_attention": "sliding",
    "local_attention": "sliding",
    "linear_attention": "linear",
    "mamba": "mamba",
    "mamba2": "mamba",
}


def _fail(option: str, value: Any, problem: str, fix: str) -> UmaError:
    return UmaError(option, value, problem, fix)


def text_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """The language-model part of a config (vllm get_hf_text_config): ``text_config``
    (or ``llm_config`` / ``language_config``) when present, top-level keys filling gaps."""
    for key in ("text_config", "llm_config", "language_config", "thinker_config"):
        sub = config.get(key)
        if isinstance(sub, dict) and sub:
            if key == "thinker_config" and isinstance(sub.get("text_config"), dict):
                sub = sub["text_config"]
            merged = dict(config)
            merged.pop(key, None)
            merged.update(sub)
            return merged
    return config


def _int(cfg: Dict[str, Any], key: str, option: str, required: bool = True, minimum: int = 1) -> Optional[int]:
    value = cfg.get(key)
    if value is None:
        if required:
            raise _fail(
                option,
                "<missing %s>" % key,
                "the model config has no '%s'" % key,
                "Give a complete Hugging Face config.json (with '%s') in model_config or model_path." % key,
            )
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(
            option,
            {key: value},
            "'%s' must be an integer >= %d" % (key, minimum),
            "Fix the value in config.json.",
        )
    return value


def _dtype_name(cfg: Dict[str, Any], top: Dict[str, Any]) -> str:
    for source in (cfg, top):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str) and value:
                name = value.replace("torch.", "")
                if name not in DTYPE_BYTES:
                    raise _fail(
                        "model_config",
                        {key: value},
                        "is a model dtype the planner cannot size",
                        "Use a float32/bfloat16/float16 checkpoint or set the dtype option.",
                    )
                return name
    return "bfloat16"


def _parse_layer_types_summary(text: str, num_layers: int) -> Optional[List[str]]:
    """Observation-style summaries: '28 x full_attention', '[L,L,L,F] x 6: 6 full + 18 GDN',
    '27 x MLA (MoE 64 experts)', '[S,S,S,S,S,F] x 10 + [S,S]'. None when not understood."""
    text = re.sub(r"\([^)]*\)", "", text).split(":", 1)[0]
    code = {"L": "linear", "F": "full", "S": "sliding", "M": "mamba", "A": "full", "G": "full"}
    kinds: List[str] = []
    for raw in text.split("+"):
        term = raw.strip()
        if not term:
            continue
        match = re.match(r"^\[([A-Za-z,\s]+)\]\s*(?:x\s*(\d+))?$", term)
        if match:
            letters = [p.strip().upper() for p in match.group(1).split(",") if p.strip()]
            if any(letter not in code for letter in letters):
                return None
            kinds += [code[letter] for letter in letters] * int(match.group(2) or 1)
            continue
        match = re.match(r"^(\d+)\s*x\s*([A-Za-z_]+)$", term)
        if not match:
            return None
        name = match.group(2).lower()
        kind = "mla" if name == "mla" else LAYER_TYPE_NAMES.get(name)
        if kind is None:
            return None
        kinds += [kind] * int(match.group(1))
    return kinds or None


def layer_kinds(cfg: Dict[str, Any], model_type: str, num_layers: int, is_mla: bool) -> List[str]:
    """Attention kind of each decoder layer: full | sliding | mla | linear | mamba | none.

    Mirrors the per-layer choice of the vLLM model files: llama.py / gemma3.py /
    mistral.py read ``layer_types`` (transformers fills it from
    ``sliding_window_pattern``); gpt_oss.py slides on even layers; qwen3_next.py
    uses ``full_attention_interval``; nemotron_h.py reads ``hybrid_override_pattern``.
    """
    layer_types = cfg.get("layer_types")
    kinds: Optional[List[str]] = None
    if isinstance(layer_types, str):
        # A free-text summary: used when it names every layer, else the
        # model family's own rule below decides.
        kinds = _parse_layer_types_summary(layer_types, num_layers)
        if kinds is not None and len(kinds) != num_layers:
            kinds = None
    if kinds is not None:
        pass  # the summary named every layer
    elif isinstance(layer_types, list) and layer_types:
        kinds = []
        for name in layer_types:
            kind = LAYER_TYPE_NAMES.get(str(name))
            if kind is None:
                raise _fail(
                    "model_config",
                    {"layer_types": name},
                    "is an attention type whose KV cache the planner does not model "
                    "(supported: %s)" % ", ".join(sorted(LAYER_TYPE_NAMES)),
                    "Use a model with full, sliding-window, MLA, linear-attention or mamba layers.",
                )
            kinds.append(kind)
    elif isinstance(cfg.get("hybrid_override_pattern"), str):
        # NemotronH: M = mamba, * = attention, - / E = MLP or MoE only (no cache).
        code = {"M": "mamba", "*": "full", "-": "none", "E": "none"}
        pattern = cfg["hybrid_override_pattern"]
        if any(ch not in code for ch in pattern):
            raise _fail(
                "model_config",
                {"hybrid_override_pattern": pattern},
                "has block codes the planner does not know (known: M * - E)",
                "Check the config.json of the model.",
            )
        kinds = [code[ch] for ch in pattern]
    elif model_type in GDN_MODEL_TYPES:
        interval = cfg.get("full_attention_interval") or 4
        kinds = ["full" if (i + 1) % interval == 0 else "linear" for i in range(num_layers)]
    elif model_type in ("gemma3_text", "gemma3", "gemma2", "cohere2"):
        pattern = cfg.get("sliding_window_pattern") or (2 if model_type == "gemma2" else 6)
        kinds = ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers)]
    elif model_type == "gpt_oss":
        kinds = ["sliding" if i % 2 == 0 else "full" for i in range(num_layers)]
    elif model_type in ("mistral", "mixtral") and cfg.get("sliding_window"):
        kinds = ["sliding"] * num_layers
    elif model_type.startswith("qwen2") and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        start = cfg.get("max_window_layers", num_layers)
        kinds = ["sliding" if i >= start else "full" for i in range(num_layers)]
    else:
        kinds = ["full"] * num_layers
    if len(kinds) != num_layers:
        raise _fail(
            "model_config",
            {"layer_types": len(kinds), "num_hidden_layers": num_layers},
            "names %d layer types for %d layers" % (len(kinds), num_layers),
            "Fix layer_types or num_hidden_layers in config.json.",
        )
    if is_mla:
        kinds = ["mla" if k == "full" else k for k in kinds]
    return kinds


def describe_model(config: Any, option: str = "model_config") -> Dict[str, Any]:
    """Normalise a config.json dict into the facts the planner uses."""
    if not isinstance(config, dict) or not config:
        raise _fail(option, config, "is not a config.json mapping", "Give the parsed content of config.json.")
    top = config
    cfg = text_config(config)
    architecture, model_type = _identity(cfg, top)
    geometry = _attention_geometry(cfg, option)
    mla = _mla_latent(cfg, model_type, architecture, option)
    kinds = layer_kinds(cfg, model_type, geometry["num_layers"], mla is not None)
    if "mla" in kinds and mla is None:
        raise _fail(
            option,
            "<missing kv_lora_rank>",
            "the layers are MLA but the config has no kv_lora_rank",
            "Give kv_lora_rank and qk_rope_head_dim in model_config.",
        )
    sliding_window = _int(cfg, "sliding_window", option) if "sliding" in kinds else None
    state = _state_geometry(cfg, kinds, model_type, option)
    hidden = geometry["hidden_size"]
    intermediate = _mlp_width(cfg, hidden)
    return {
        "architecture": architecture,
        "model_type": model_type,
        "dtype": _dtype_name(cfg, top),
        "num_layers": geometry["num_layers"],
        "layer_kinds": kinds,
        "num_heads": geometry["num_heads"],
        "num_kv_heads": geometry["num_kv_heads"],
        "head_dim": geometry["head_dim"],
        "mla": mla,
        "sliding_window": sliding_window,
        "state": state,
        "hidden_size": hidden,
        "intermediate_size": intermediate if isinstance(intermediate, int) else 4 * hidden,
        "vocab_size": cfg.get("vocab_size") if isinstance(cfg.get("vocab_size"), int) else 32000,
        "max_position_embeddings": _max_position(cfg),
        "is_hybrid": state is not None,
    }


def _identity(cfg: Dict[str, Any], top: Dict[str, Any]) -> Tuple[str, str]:
    """The first architecture class name and the (lower-case) model_type."""
    archs = top.get("architectures") or cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    architecture = archs[0] if archs else ""
    model_type = str(cfg.get("model_type") or top.get("model_type") or "").lower()
    if not model_type:
        model_type = _model_type_from_architecture(architecture)
    return architecture, model_type


def _attention_geometry(cfg: Dict[str, Any], option: str) -> Dict[str, int]:
    """Layers, attention heads, KV heads, hidden size and head size."""
    num_layers = _int(cfg, "num_hidden_layers", option)
    num_heads = _int(cfg, "num_attention_heads", option)
    num_kv_heads = cfg.get("num_key_value_heads")
    if num_kv_heads is None:
        num_kv_heads = num_heads
    num_kv_heads = _int({"num_key_value_heads": num_kv_heads}, "num_key_value_heads", option)
    hidden = _int(cfg, "hidden_size", option)
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % num_heads:
            raise _fail(
                option,
                {"hidden_size": hidden, "num_attention_heads": num_heads},
                "head_dim is missing and hidden_size is not a multiple of num_attention_heads",
                "Add head_dim to config.json.",
            )
        head_dim = hidden // num_heads
    head_dim = _int({"head_dim": head_dim}, "head_dim", option)
    return {
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "hidden_size": hidden,
        "head_dim": head_dim,
    }


def _mla_latent(cfg: Dict[str, Any], model_type: str, architecture: str, option: str) -> Optional[Dict[str, int]]:
    """The MLA latent size (kv_lora_rank, qk_rope_head_dim), or None when attention is not MLA."""
    kv_lora_rank = cfg.get("kv_lora_rank")
    is_mla = kv_lora_rank is not None and (
        model_type in MLA_MODEL_TYPES
        or "deepseek" in architecture.lower()
        or "mla" in str(cfg.get("layer_types", "")).lower()
    )
    if not is_mla:
        return None
    return {
        "kv_lora_rank": _int(cfg, "kv_lora_rank", option),
        "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim", option),
    }


def _state_geometry(cfg: Dict[str, Any], kinds: List[str], model_type: str, option: str) -> Optional[Dict[str, Any]]:
    """The recurrent state of linear-attention / mamba layers (mamba wins when both appear)."""
    state = None
    if "linear" in kinds:
        state = _gated_delta_net_state(cfg, model_type, option)
    if "mamba" in kinds:
        state = _mamba2_state(cfg, model_type, option)
    return state


def _gated_delta_net_state(cfg: Dict[str, Any], model_type: str, option: str) -> Dict[str, Any]:
    return {
        "family": "gated_delta_net",
        "num_k_heads": _int(cfg, "linear_num_key_heads", option),
        "num_v_heads": _int(cfg, "linear_num_value_heads", option),
        "head_k_dim": _int(cfg, "linear_key_head_dim", option),
        "head_v_dim": _int(cfg, "linear_value_head_dim", option),
        "conv_kernel": _int(cfg, "linear_conv_kernel_dim", option),
        # Qwen3.5 pins the recurrent state dtype in its config (mamba_ssm_dtype
        # float32, honoured by Qwen3_5ForConditionalGenerationConfig in
        # model_executor/models/config.py); assumed when a summary omits it.
        "ssm_dtype": cfg.get("mamba_ssm_dtype") or ("float32" if model_type.startswith("qwen3_5") else None),
    }


def _mamba2_state(cfg: Dict[str, Any], model_type: str, option: str) -> Dict[str, Any]:
    mamba_heads = _int(cfg, "mamba_num_heads", option)
    mamba_head_dim = _int(cfg, "mamba_head_dim", option)
    return {
        "family": "mamba2",
        "intermediate": mamba_heads * mamba_head_dim,
        "n_groups": _int(cfg, "n_groups", option),
        "num_heads": mamba_heads,
        "head_dim": mamba_head_dim,
        "state_size": _int(cfg, "ssm_state_size", option),
        "conv_kernel": _int(cfg, "conv_kernel", option),
        # NemotronH defaults its SSM state to float32 (NemotronHForCausalLMConfig).
        "ssm_dtype": cfg.get("mamba_ssm_cache_dtype") or ("float32" if model_type == "nemotron_h" else None),
    }


def _mlp_width(cfg: Dict[str, Any], hidden: int) -> Any:
    """The MLP width one token passes through: intermediate_size, or experts x top-k for MoE."""
    intermediate = cfg.get("intermediate_size") or 4 * hidden
    moe_inter = cfg.get("moe_intermediate_size")
    topk = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or cfg.get("moe_topk")
    if isinstance(moe_inter, int) and isinstance(topk, int):
        intermediate = max(intermediate if isinstance(intermediate, int) else 0, moe_inter * topk)
    return intermediate


def _max_position(cfg: Dict[str, Any]) -> Optional[int]:
    """The smallest of the config's max-length keys (None when it has none)."""
    max_len = None
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length"):
        if isinstance(cfg.get(key), int) and cfg[key] > 0:
            max_len = cfg[key] if max_len is None else min(max_len, cfg[key])
    return max_len


def _model_type_from_architecture(architecture: str) -> str:
    name = architecture.lower()
    for marker, model_type in (
        ("qwen3_5", "qwen3_5"),
        ("qwen3next", "qwen3_next"),
        ("deepseekv3", "deepseek_v3"),
        ("deepseekv2", "deepseek_v2"),
        ("gptoss", "gpt_oss"),
        ("gemma3", "gemma3"),
        ("mistral", "mistral"),
        ("qwen3", "qwen3"),
        ("qwen2", "qwen2"),
        ("llama", "llama"),
    ):
        if marker in name:
            return model_type
    return ""


# --- local checkpoints -----------------------------------------------------------


def safetensors_header(path: str) -> Dict[str, Any]:
    """The JSON header of one .safetensors file (8-byte little-endian length + JSON)."""
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise ValueError("file shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", raw)
        size = os.fstat(handle.fileno()).st_size
        if length <= 0 or 8 + length > size or length > 100 * 1024 * 1024:
            raise ValueError("header length %d does not fit the file (%d bytes)" % (length, size))
        header = json.loads(handle.read(length).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    data_size = size - 8 - length
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        if not 0 <= begin <= end <= data_size:
            raise ValueError("tensor %s has data_offsets outside the file" % name)
    return header


def tensor_bytes(header: Dict[str, Any]) -> Tuple[int, int]:
    """(bytes, tensor count) of one header."""
    total = 0
    count = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        total += end - begin
        count += 1
    return total, count


def read_model_dir(path: Any) -> Dict[str, Any]:
    """config.json and the weight bytes of a local model directory.

    The shard list comes from model.safetensors.index.json when present (every
    file named in weight_map must exist), else every *.safetensors file.
    """
    option = "model_path"
    if not isinstance(path, str) or not path:
        raise _fail(option, path, "is not a directory path", "Give the local model directory.")
    if not os.path.isdir(path):
        raise _fail(
            option, path, "is not a readable directory", "Give a local model directory (config.json + safetensors)."
        )
    config_path = os.path.join(path, "config.json")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        raise _fail(option, path, "has no config.json", "Point model_path at a Hugging Face model directory.") from None
    except (OSError, ValueError) as err:
        raise _fail(option, path, "config.json cannot be read (%s)" % err, "Fix or re-download config.json.") from None
    index_path = os.path.join(path, "model.safetensors.index.json")
    shards: List[str] = []
    if os.path.exists(index_path):
        try:
            with open(index_path, encoding="utf-8") as handle:
                index = json.load(handle)
            shards = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise _fail(
                option,
                path,
                "model.safetensors.index.json cannot be read (%s)" % err,
                "Fix or re-download the index file.",
            ) from None
    else:
        try:
            shards = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        except OSError as err:
            raise _fail(
                option, path, "cannot be listed (%s)" % err, "Check permissions of the model directory."
            ) from None
    if not shards:
        raise _fail(
            option,
            path,
            "has no .safetensors weights",
            "Only safetensors checkpoints are sized; convert the model or give model_config and weights_bytes.",
        )
    weights = 0
    tensors = 0
    for shard in shards:
        shard_path = os.path.join(path, shard)
        try:
            nbytes, count = tensor_bytes(safetensors_header(shard_path))
        except FileNotFoundError:
            raise _fail(
                option, path, "shard %s listed in the index is missing" % shard, "Re-download the model."
            ) from None
        except (OSError, ValueError, KeyError, TypeError, struct.error) as err:
            raise _fail(
                option, path, "shard %s is not a valid safetensors file (%s)" % (shard, err), "Re-download it."
            ) from None
        weights += nbytes
        tensors += count
    return {"config": config, "weights_bytes": weights, "shards": shards, "tensors": tensors}
