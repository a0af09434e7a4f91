# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a tiny Llama checkpoint that the real vLLM engine loads and serves.

No model hub is reachable in the lab, so tests make their own model:
config.json (LlamaConfig: vocab 512, hidden 256, intermediate 512, 2 layers,
4 heads, 2 KV heads, head_dim 64), random weights as real safetensors files
(written by the ``safetensors`` package from numpy buffers; no torch needed),
a WordLevel tokenizer.json built with ``tokenizers``, tokenizer_config.json
and generation_config.json.

  python3 lab/make_model.py --out /tmp/tiny-llama
  python3 lab/make_model.py --out /tmp/tiny-llama --shards 3 --pad-gib 1

--pad-gib makes the checkpoint at least that large so a load is measurable.
vLLM's loader refuses unknown tensor names (AutoWeightsLoader raises "There is
no module or parameter named ..."), but it reads and then drops tensors whose
name contains ``rotary_emb.inv_freq`` (AutoWeightsLoader.
REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER; older releases skip them in
LlamaForCausalLM.load_weights), so the default pad mode adds such tensors:
they are read from disk like any weight and leave the model unchanged.
``--pad-mode layers`` pads with extra decoder layers instead (a larger model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Tuple

import numpy as np
from safetensors import serialize_file

VOCAB = 512
HIDDEN = 256
INTERMEDIATE = 512
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 2048
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
WORDS = (
    "the a an and or of to in on at is are was were be been it this that with for as by from hello world "
    "model memory cache token tokens unified spark node engine vllm serve test tiny llama answer question "
    "one two three four five six seven eight nine ten yes no good bad fast slow big small red green blue"
).split()


def to_bf16(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even) as little-endian uint16."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return np.ascontiguousarray(((bits + rounding) >> 16).astype("<u2"))


def tensor_entry(array: np.ndarray, dtype: str, keep_alive: List[np.ndarray]) -> object:
    """One tensor for safetensors.serialize_file: a TensorSpec (safetensors >= 0.8)
    or the {"dtype", "shape", "data"} dict older releases take."""
    buf = to_bf16(array) if dtype == "bfloat16" else np.ascontiguousarray(array, dtype="<f4")
    keep_alive.append(buf)
    try:
        from safetensors import TensorSpec
    except ImportError:
        return {"dtype": dtype, "shape": list(array.shape), "data": buf.tobytes()}
    return TensorSpec(dtype=dtype, shape=tuple(array.shape), data_ptr=buf.ctypes.data, data_len=buf.nbytes)


def llama_tensors(rng: np.random.Generator, layers: int) -> List[Tuple[str, np.ndarray]]:
    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    tensors = [("model.embed_tokens.weight", normal(VOCAB, HIDDEN))]
    for i in range(layers):
        p = "model.layers.%d." % i
        tensors += [
            (p + "self_attn.q_proj.weight", normal(HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.k_proj.weight", normal(KV_HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.v_proj.weight", normal(KV_HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.o_proj.weight", normal(HIDDEN, HEADS * HEAD_DIM)),
            (p + "mlp.gate_proj.weight", normal(INTERMEDIATE, HIDDEN)),
            (p + "mlp.up_proj.weight", normal(INTERMEDIATE, HIDDEN)),
            (p + "mlp.down_proj.weight", normal(HIDDEN, INTERMEDIATE)),
            (p + "input_layernorm.weight", np.ones(HIDDEN, dtype=np.float32)),
            (p + "post_attention_layernorm.weight", np.ones(HIDDEN, dtype=np.float32)),
        ]
    tensors += [("model.norm.weight", np.ones(HIDDEN, dtype=np.float32)), ("lm_head.weight", normal(VOCAB, HIDDEN))]
    return tensors


def nbytes(array: np.ndarray, dtype: str) -> int:
    return int(array.size) * (2 if dtype == "bfloat16" else 4)


def padding_tensors(rng: np.random.Generator, pad_bytes: int, dtype: str) -> List[Tuple[str, np.ndarray]]:
    """Tensors vLLM reads and drops: names containing 'rotary_emb.inv_freq'."""
    chunk_elems = 16 * 1024 * 1024 // (2 if dtype == "bfloat16" else 4)  # 16 MiB per tensor
    tensors = []
    index = 0
    while pad_bytes > 0:
        elems = min(chunk_elems, max(1, pad_bytes // (2 if dtype == "bfloat16" else 4)))
        tensors.append(("model.padding.%d.rotary_emb.inv_freq" % index, rng.random(elems, dtype=np.float32)))
        pad_bytes -= nbytes(tensors[-1][1], dtype)
        index += 1
    return tensors


def write_tokenizer(out: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {}
    for token in SPECIAL + WORDS:
        vocab.setdefault(token, len(vocab))
    for i in range(len(vocab), VOCAB):
        vocab["w%d" % i] = i
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:",
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    with open(os.path.join(out, "special_tokens_map.json"), "w", encoding="utf-8") as handle:
        json.dump(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, handle, indent=2
        )


def write_model(out: str, shards: int, pad_gib: float, seed: int, dtype: str, pad_mode: str) -> Dict[str, object]:
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    layers = LAYERS
    pad_bytes = int(pad_gib * (1 << 30))
    base = llama_tensors(rng, layers)
    base_bytes = sum(nbytes(a, dtype) for _unused, a in base)
    extra: List[Tuple[str, np.ndarray]] = []
    if pad_bytes > base_bytes:
        if pad_mode == "layers":
            per_layer = (base_bytes - sum(nbytes(a, dtype) for n, a in base if ".layers." not in n)) // LAYERS
            fixed = base_bytes - per_layer * LAYERS
            layers = max(LAYERS, -(-(pad_bytes - fixed) // per_layer))
            base = llama_tensors(np.random.default_rng(seed), layers)
        else:
            extra = padding_tensors(rng, pad_bytes - base_bytes, dtype)
    tensors = base + extra
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POSITIONS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "torch_dtype": dtype,
        "transformers_version": "4.46.0",
        "use_cache": True,
    }
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as handle:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "do_sample": False}, handle, indent=2)
    write_tokenizer(out)

    for name in os.listdir(out):
        if name.endswith(".safetensors") or name == "model.safetensors.index.json":
            os.unlink(os.path.join(out, name))
    # Spread tensors over the shards by size, keeping the order.
    total = sum(nbytes(a, dtype) for _unused, a in tensors)
    target = -(-total // shards)
    groups: List[List[Tuple[str, np.ndarray]]] = [[]]
    size = 0
    for name, array in tensors:
        if size >= target and len(groups) < shards:
            groups.append([])
            size = 0
        groups[-1].append((name, array))
        size += nbytes(array, dtype)
    while len(groups) < shards:
        groups.append([])
    weight_map = {}
    files = []
    for i, group in enumerate(groups):
        fname = "model.safetensors" if shards == 1 else "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        keep_alive: List[np.ndarray] = []
        payload = {name: tensor_entry(array, dtype, keep_alive) for name, array in group}
        serialize_file(payload, os.path.join(out, fname), metadata={"format": "pt"})
        os.chmod(os.path.join(out, fname), 0o644)
        files.append(fname)
        for name, _unused in group:
            weight_map[name] = fname
    if shards > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        with open(os.path.join(out, "model.safetensors.index.json"), "w", encoding="utf-8") as handle:
            json.dump(index, handle, indent=2, sort_keys=True)
    return {"out": out, "files": files, "bytes": total, "layers": layers, "tensors": len(tensors)}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="model directory to write")
    parser.add_argument("--shards", type=int, default=1, help="number of safetensors shard files (default 1)")
    parser.add_argument("--pad-gib", type=float, default=0.0, help="make the checkpoint at least this many GiB")
    parser.add_argument("--pad-mode", choices=["rotary", "layers"], default="rotary", help="how to pad (see above)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="weight dtype")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be >= 1")
    if args.pad_gib < 0:
        parser.error("--pad-gib must be >= 0")
    result = write_model(args.out, args.shards, args.pad_gib, args.seed, args.dtype, args.pad_mode)
    print(json.dumps(dict(result), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
