# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a CUDA process really holds on a discrete NVIDIA card, next to what the planner assumes.

Runs on a machine with an NVIDIA GPU and PyTorch (transformers for the model); no vLLM
(vLLM's CUDA wheel is not installed there) and no download: the models are built from the
config.json fixtures in tests/unit/fixtures/models with random bf16 weights. It measures,
with torch.cuda.mem_get_info / memory_reserved / max_memory_allocated (and NVML when the
nvidia-ml-py package is there):

- the CUDA context: free device memory before the process's first CUDA call (NVML, which
  needs no context) minus free after it, and the driver's per-process figure;
- the non-torch increase: (device used - torch reserved) later minus at the first snapshot
  after the context exists (how vLLM 0.7+ defines its "non-torch memory");
- the weights' bytes (parameters x element size) and torch's allocation delta;
- the activation peak of one forward pass of max_num_batched_tokens tokens (the planner's
  default for the card's memory unless --tokens), two ways:
  * ``hf``: the transformers model's decoder (model.model, SDPA attention, no KV cache);
  * ``vllm-shaped``: a pure-torch stand-in for vLLM's layer shapes (fused qkv and gate_up
    projections, in-place SiLU-and-mul, residual added in place, flash SDPA; no rotary),
    two layers (the peak of a layer-by-layer forward does not grow with depth);
- the sampler peak per element of the [max_num_seqs, vocab] logits for a sort-based
  top-k/top-p sampler written after vLLM's PyTorch-native path (not vLLM's own code);

and prints them next to the planner's activation_reserve() for the same model, tokens and
card (plugins/module_utils/plan/budget.py; imported from ansible_collections on
PYTHONPATH, else the planner columns are blank). Numbers only, no pass/fail.

    python3 benchmarks/gpu_memory_check.py [--models DIR ...] [--tokens N ...] [--json FILE]
    python3 benchmarks/gpu_memory_check.py --device cpu --tiny   # smoke run of the code paths
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIB = 1 << 30
MIB = 1 << 20
DEFAULT_MODELS = ["qwen2.5-1.5b-instruct", "llama-3-8b"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, help="config dirs or fixture names")
    parser.add_argument("--fixtures", default=str(ROOT / "tests" / "unit" / "fixtures" / "models"))
    parser.add_argument("--tokens", nargs="+", type=int, help="forward sizes (default: the planner's default)")
    parser.add_argument("--max-num-seqs", type=int, help="sampler rows (default: the planner's default)")
    parser.add_argument("--vllm-version", default=None, help="the planner's target release (default: its own)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="shrink the configs (smoke run without a GPU)")
    parser.add_argument("--json", help="write every figure to this file")
    return parser.parse_args(argv)


# --- the planner (pure stdlib) ---------------------------------------------------------


def load_planner():
    from ansible_collections.uma.vllm.plugins.module_utils.plan import budget, inputs

    return budget, inputs


def planner_figures(planner, config, weights_bytes, total_bytes, tokens, seqs, version):
    """activation_reserve() of the planner for this model on a discrete card of total_bytes."""
    if planner is None:
        return None
    budget, inputs = planner
    params = {
        "model_config": config,
        "weights_bytes": weights_bytes,
        "total_memory_gib": total_bytes / float(GIB),
        "unified_memory": False,
        "max_model_len": min(4096, config.get("max_position_embeddings") or 4096),
    }
    if tokens:
        params["max_num_batched_tokens"] = tokens
    if seqs:
        params["max_num_seqs"] = seqs
    if version:
        params["vllm_version"] = version
    ctx = inputs.resolve_inputs(params)
    parts = budget.activation_reserve(ctx.desc, ctx)
    desc = ctx.desc
    q_kv = (desc["num_heads"] + 2 * desc["num_kv_heads"]) * desc["head_dim"]
    per_token = ctx.model_dtype_bytes * (4 * desc["hidden_size"] + q_kv + 3 * desc["intermediate_size"])
    return {
        "vllm_version": ".".join(str(x) for x in ctx.version),
        "max_num_batched_tokens": ctx.max_num_batched_tokens,
        "max_num_seqs": ctx.max_num_seqs,
        "forward_bytes": int(ctx.max_num_batched_tokens * per_token * budget.FORWARD_FACTOR),
        "forward_per_token_bytes": per_token,
        "forward_factor": budget.FORWARD_FACTOR,
        "sampler_bytes_per_element": budget.sampler_bytes_per_element(ctx.version),
        "sampler_bytes_per_element_sort": budget.SAMPLER_BYTES_V1_SORT,
        "non_torch_bytes": parts["non_torch"],
        "cuda_graphs_bytes": parts["cuda_graphs"],
        "activation_parts": parts,
    }


# --- device memory probes ----------------------------------------------------------------


class Probe:
    """Device-wide and torch figures; NVML when available (it needs no CUDA context)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device == "cuda"
        self.nvml = None
        if self.cuda:
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
            except Exception:  # NVML is optional
                self.nvml = None

    def nvml_memory(self):
        """(total, free, used) as NVML reports them; its total and used include the driver's reserve."""
        if self.nvml is None:
            return None, None, None
        pynvml, handle = self.nvml
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.free), int(info.used)

    def nvml_process_bytes(self):
        """What the driver charges to this process (None when it does not say)."""
        if self.nvml is None:
            return None
        pynvml, handle = self.nvml
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:  # not every driver lists processes
            return None
        for proc in procs:
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
        return None

    def device_used(self):
        if not self.cuda:
            return None
        free, total = self.torch.cuda.mem_get_info()
        return int(total - free)

    def non_torch(self):
        if not self.cuda:
            return None
        return self.device_used() - int(self.torch.cuda.memory_reserved())

    def allocated(self):
        return int(self.torch.cuda.memory_allocated()) if self.cuda else None

    def reset_peak(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_since(self, base):
        if not self.cuda:
            return None
        self.torch.cuda.synchronize()
        return int(self.torch.cuda.max_memory_allocated()) - base


def context_figures(torch, probe):
    """The CUDA context: before/after the first CUDA call, and the first non-torch snapshot."""
    nvml_total, nvml_free, nvml_used = probe.nvml_memory()
    if not probe.cuda:
        return {"nvml_used_before": None}
    start = time.monotonic()
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    init_s = time.monotonic() - start
    used_after = int(total - free)
    out = {
        "total_bytes": int(total),
        "nvml_total_before": nvml_total,
        "nvml_free_before": nvml_free,
        "nvml_used_before": nvml_used,
        "used_after_init": used_after,
        # free before (NVML) - free after (CUDA): both leave out the driver's reserve, which
        # NVML's total and used include and CUDA's total does not
        "context_bytes": None if nvml_free is None else nvml_free - int(free),
        "nvml_process_bytes_after_init": probe.nvml_process_bytes(),
        "init_seconds": round(init_s, 3),
        "baseline_non_torch": probe.non_torch(),
    }
    # first bf16 matmul: cuBLAS(Lt) handles, workspaces and the lazily loaded kernels
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    del a
    out["non_torch_after_first_matmul"] = probe.non_torch() - out["baseline_non_torch"]
    out["reserved_after_first_matmul"] = int(torch.cuda.memory_reserved())
    out["nvml_process_bytes_after_first_matmul"] = probe.nvml_process_bytes()
    return out


# --- models -----------------------------------------------------------------------------


def load_config(name, fixtures, tiny):
    path = pathlib.Path(name)
    if not path.is_dir():
        path = pathlib.Path(fixtures) / name
    config = json.loads((path / "config.json").read_text())
    if tiny:
        config.update(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            bos_token_id=None,
            eos_token_id=None,
        )
        config.pop("head_dim", None)
    return path.name, config


def build_hf_model(torch, config, device):
    import transformers

    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "transformers_version"})
    cfg.use_cache = False
    try:
        cfg._attn_implementation = "sdpa"
    except Exception:  # another transformers: keep its default
        pass
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model.eval()


def hf_forward_peak(torch, model, tokens, probe, device):
    """Peak bytes above the weights for the decoder on [1, tokens] ids; the last hidden state."""
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), device=device, generator=gen)
    base = probe.allocated()
    probe.reset_peak()
    with torch.inference_mode():
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
    peak = probe.peak_since(base) if base is not None else None
    finite = bool(torch.isfinite(hidden).all())
    return peak, hidden, finite


def vllm_shaped_peak(torch, config, tokens, probe, device, layers=2):
    """Peak bytes of a pure-torch forward with vLLM's layer shapes (a stand-in, see the docstring)."""
    import torch.nn.functional as F

    hid = config["hidden_size"]
    inter = config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hid // heads
    dt = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(2)

    def weight(rows, cols):
        return torch.randn(rows, cols, device=device, dtype=dt, generator=gen) * 0.02

    stack = [
        {
            "qkv": weight((heads + 2 * kv_heads) * head_dim, hid),
            "o": weight(hid, heads * head_dim),
            "gate_up": weight(2 * inter, hid),
            "down": weight(hid, inter),
            "norm1": torch.ones(hid, device=device, dtype=dt),
            "norm2": torch.ones(hid, device=device, dtype=dt),
        }
        for _layer in range(layers)
    ]
    eps = config.get("rms_norm_eps", 1e-6)
    base = probe.allocated()
    probe.reset_peak()
    how = {"attention": "flash, enable_gqa"}
    with torch.inference_mode():
        residual = torch.randn(tokens, hid, device=device, dtype=dt, generator=gen)  # the embedding output
        for lw in stack:
            h = F.rms_norm(residual, (hid,), lw["norm1"], eps)
            qkv = h @ lw["qkv"].t()
            del h
            q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
            q = q.view(tokens, heads, head_dim).transpose(0, 1).unsqueeze(0)
            k = k.view(tokens, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)
            v = v.view(tokens, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)
            attn = _attention(torch, F, q, k, v, heads, kv_heads, how)
            del q, k, v, qkv
            attn = attn.squeeze(0).transpose(0, 1).reshape(tokens, heads * head_dim)
            residual.add_(attn @ lw["o"].t())
            del attn
            h = F.rms_norm(residual, (hid,), lw["norm2"], eps)
            gate_up = h @ lw["gate_up"].t()
            del h
            act = F.silu(gate_up[:, :inter])
            act.mul_(gate_up[:, inter:])
            del gate_up
            residual.add_(act @ lw["down"].t())
            del act
    peak = probe.peak_since(base) if base is not None else None
    finite = bool(torch.isfinite(residual).all())
    del residual, stack
    return peak, finite, how


def _attention(torch, F, q, k, v, heads, kv_heads, how):
    if q.device.type != "cuda":
        how["attention"] = "default SDPA (cpu)"
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
        except RuntimeError:
            how["attention"] = "flash, K/V repeated to the query heads (no GQA in this torch's flash path)"
            rep = heads // kv_heads
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True
            )


def sampler_peak(torch, logits, probe, device):
    """Peak bytes above the bf16 logits of a sort-based top-k/top-p sample (after vLLM's native path)."""
    rows = logits.shape[0]
    base = probe.allocated()
    probe.reset_peak()
    with torch.inference_mode():
        top_k = torch.full((rows,), 50, device=device, dtype=torch.long)
        top_p = torch.full((rows,), 0.9, device=device, dtype=torch.float32)
        x = logits.to(torch.float32)
        x.div_(0.7)  # temperature
        x_sort, x_idx = x.sort(dim=-1, descending=False)
        kth = x_sort.gather(1, (x_sort.size(1) - top_k).unsqueeze(1))
        x_sort.masked_fill_(x_sort < kth, -float("inf"))
        probs_sort = x_sort.softmax(dim=-1)
        cum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
        mask = cum <= 1 - top_p.unsqueeze(1)
        mask[:, -1] = False
        x_sort.masked_fill_(mask, -float("inf"))
        del mask, cum, probs_sort, kth
        x = x_sort.scatter(dim=-1, index=x_idx, src=x_sort)
        del x_sort, x_idx
        probs = x.softmax(dim=-1, dtype=torch.float32)
        del x
        noise = torch.empty_like(probs).exponential_()
        sampled = probs.div_(noise).argmax(dim=-1)
        del noise, probs
    peak = probe.peak_since(base) if base is not None else None
    return peak, int(sampled.numel())


# --- one model -----------------------------------------------------------------------------


def measure_model(torch, probe, args, planner, name, config, total_bytes, ctx_fig):
    """Every figure of one model: weights, forward peaks per token count, sampler, planner."""
    before = probe.allocated()
    model = build_hf_model(torch, config, args.device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    row = {
        "model": name,
        "weights_bytes": int(weights),
        "hf_attention": getattr(model.config, "_attn_implementation", None),
        "weights_allocated_bytes": None if before is None else probe.allocated() - before,
        "runs": [],
    }
    default = planner_figures(planner, config, weights, total_bytes, None, args.max_num_seqs, args.vllm_version)
    tokens_list = args.tokens or ([default["max_num_batched_tokens"]] if default else [64])
    seqs = args.max_num_seqs or (default["max_num_seqs"] if default else 16)
    hidden = None
    for tokens in tokens_list:
        hf_peak, hidden, hf_finite = hf_forward_peak(torch, model, tokens, probe, args.device)
        plan = planner_figures(planner, config, weights, total_bytes, tokens, seqs, args.vllm_version)
        row["runs"].append(
            {
                "tokens": tokens,
                "hf_forward_peak_bytes": hf_peak,
                "hf_output_finite": hf_finite,
                "planner": plan,
                "non_torch_increase": _non_torch(probe, ctx_fig),
            }
        )
    with torch.inference_mode():
        rows = hidden[0, -seqs:] if hidden.shape[1] >= seqs else hidden[0].repeat(-(-seqs // hidden.shape[1]), 1)
        logits = model.lm_head(model.model.norm(rows[:seqs]))
    del hidden, rows
    s_peak, sampled = sampler_peak(torch, logits, probe, args.device)
    elements = logits.shape[0] * logits.shape[1]
    row["sampler"] = {
        "max_num_seqs": seqs,
        "vocab": int(logits.shape[1]),
        "peak_bytes": s_peak,
        "bytes_per_element": None if s_peak is None else round(s_peak / float(elements), 2),
        "sampled": sampled,
    }
    del logits, model
    _free(torch, args.device)
    for run in row["runs"]:
        peak, finite, how = vllm_shaped_peak(torch, config, run["tokens"], probe, args.device)
        run.update(vllm_shaped_peak_bytes=peak, vllm_shaped_finite=finite, vllm_shaped_how=how["attention"])
        _free(torch, args.device)
    row["non_torch_increase_end"] = _non_torch(probe, ctx_fig)
    return row


def _non_torch(probe, ctx_fig):
    now = probe.non_torch()
    return None if now is None else now - ctx_fig["baseline_non_torch"]


def _free(torch, device):
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# --- the table -----------------------------------------------------------------------------


def _g(value, digits=2):
    return "-" if value is None else "%.*f" % (digits, value / float(GIB))


def _ratio(a, b):
    return "-" if a is None or not b else "%.2f" % (a / float(b))


def render(result):
    lines = []
    env = result["environment"]
    ctx = result["context"]
    lines.append(
        "device: %s | driver %s | torch %s | CUDA %s | transformers %s"
        % (env["device_name"], env["driver"], env["torch"], env["cuda"], env["transformers"])
    )
    lines.append(
        "CUDA total %s GiB | CUDA context %s GiB (NVML free before - CUDA free after; driver per-process %s GiB) | "
        "first bf16 matmul adds non-torch %s GiB"
        % (
            _g(ctx.get("total_bytes")),
            _g(ctx.get("context_bytes")),
            _g(ctx.get("nvml_process_bytes_after_init")),
            _g(ctx.get("non_torch_after_first_matmul"), 3),
        )
    )
    lines.append("")
    lines.append(
        "| model | tokens | weights GiB | HF fwd peak GiB | vLLM-shaped fwd peak GiB | planner forward GiB "
        "(x%s) | planner / vLLM-shaped | planner / HF | non-torch increase GiB (planner) |"
        % (result.get("forward_factor") or "-")
    )
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in result["models"]:
        for run in row["runs"]:
            plan = run["planner"] or {}
            lines.append(
                "| %s | %d | %s | %s | %s | %s | %s | %s | %s (%s) |"
                % (
                    row["model"],
                    run["tokens"],
                    _g(row["weights_bytes"]),
                    _g(run["hf_forward_peak_bytes"]),
                    _g(run.get("vllm_shaped_peak_bytes")),
                    _g(plan.get("forward_bytes")),
                    _ratio(plan.get("forward_bytes"), run.get("vllm_shaped_peak_bytes")),
                    _ratio(plan.get("forward_bytes"), run["hf_forward_peak_bytes"]),
                    _g(run["non_torch_increase"], 3),
                    _g(plan.get("non_torch_bytes"), 3),
                )
            )
    lines.append("")
    lines.append(
        "| model | max_num_seqs x vocab | sampler peak GiB | B/element | planner B/element (sort; default release) |"
    )
    lines.append("| --- | --- | --- | --- | --- |")
    for row in result["models"]:
        s = row["sampler"]
        plan = (row["runs"][0]["planner"] or {}) if row["runs"] else {}
        lines.append(
            "| %s | %d x %d | %s | %s | %s; %s (%s) |"
            % (
                row["model"],
                s["max_num_seqs"],
                s["vocab"],
                _g(s["peak_bytes"], 3),
                "-" if s["bytes_per_element"] is None else s["bytes_per_element"],
                plan.get("sampler_bytes_per_element_sort", "-"),
                plan.get("sampler_bytes_per_element", "-"),
                plan.get("vllm_version", "-"),
            )
        )
    return "\n".join(lines)


def environment(torch, probe):
    import transformers

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__}
    if probe.cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(device_name=props.name, capability="%d.%d" % (props.major, props.minor))
        env["multiprocessors"] = props.multi_processor_count
    else:
        env["device_name"] = "cpu (smoke run: no device figures)"
    env["driver"] = None
    if probe.nvml is not None:
        pynvml = probe.nvml[0]
        env["driver"] = pynvml.nvmlSystemGetDriverVersion()
        if isinstance(env["driver"], bytes):
            env["driver"] = env["driver"].decode()
    return env


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        sys.exit("gpu_memory_check.py: needs PyTorch (and transformers); run it where they are installed")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_memory_check.py: no CUDA device visible; --device cpu --tiny runs the code paths only")
    probe = Probe(torch, args.device)
    ctx_fig = context_figures(torch, probe)  # first: nothing else may touch CUDA before it
    planner = load_planner()
    if planner is None:
        print("planner not importable (PYTHONPATH=.cache/collections): planner columns blank", file=sys.stderr)
    total = ctx_fig.get("total_bytes") or 80 * GIB
    result = {
        "environment": environment(torch, probe),
        "context": ctx_fig,
        "forward_factor": planner[0].FORWARD_FACTOR if planner else None,
        "models": [],
    }
    for name in args.models:
        label, config = load_config(name, args.fixtures, args.tiny)
        start = time.monotonic()
        row = measure_model(torch, probe, args, planner, label, config, total, ctx_fig)
        row["seconds"] = round(time.monotonic() - start, 1)
        result["models"].append(row)
    result["context"]["nvml_process_bytes_end"] = probe.nvml_process_bytes()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
