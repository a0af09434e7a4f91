"""lab/vm/uma_loader.py, the stand-in for vLLM on a GB10 rank (issue 20 item 3), on the host.

No VM and no fakegb10 here: "device memory" is PlainFileDriver (a plain file, mmapped: the
loader's named test driver). What is checked: the safetensors header parser against the real
``safetensors`` package, this rank's slices (every byte of a tensor kept by exactly one rank),
PyTorch's caching-allocator segment rule, vLLM 0.32's startup check (and that the collection's
own journal parser reads the loader's lines as vLLM's), the option errors, and one whole run
over HTTP (/health, /v1/completions, /metrics) with the bytes in the driver file compared to
the checkpoint's.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import pathlib
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import parse as _diagnose_parse

ROOT = pathlib.Path(__file__).resolve().parents[1].parent
LOADER = ROOT / "lab" / "vm" / "uma_loader.py"
MIB = 1 << 20


def load():
    spec = importlib.util.spec_from_file_location("uma_loader", LOADER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


L = load()


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype, shape, bytes)} -> a safetensors file, written by hand (stdlib)."""
    header = {"__metadata__": metadata or {"format": "pt"}}
    pos = 0
    blob = b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        blob += data
        pos += len(data)
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + blob)


def pattern(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


TINY_CONFIG = {
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "head_dim": 16,
    "max_position_embeddings": 256,
}


def tiny_model(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    write_safetensors(
        d / "model-00001-of-00002.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [8, 64], pattern(8 * 64 * 2, 1)),
            "model.layers.0.self_attn.o_proj.weight": ("BF16", [64, 64], pattern(64 * 64 * 2, 2)),
            "model.layers.0.input_layernorm.weight": ("BF16", [64], pattern(128, 3)),
        },
    )
    write_safetensors(
        d / "model-00002-of-00002.safetensors",
        {
            "model.padding.0.rotary_emb.inv_freq": ("BF16", [3 * MIB], pattern(6 * MIB, 4)),
            "model.norm.weight": ("F32", [64], pattern(256, 5)),
        },
    )
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    return d


# --- the safetensors header ---------------------------------------------------------------


def test_header_matches_the_safetensors_package(tmp_path):
    np = pytest.importorskip("numpy")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {
        "a.weight": np.arange(24, dtype=np.float32).reshape(4, 6),
        "b.bias": np.arange(5, dtype=np.int64),
        "c.scalar": np.array(3.5, dtype=np.float16),
    }
    path = tmp_path / "real.safetensors"
    safetensors_numpy.save_file(arrays, str(path), metadata={"format": "pt"})
    with open(path, "rb") as fh:
        _start, tensors = L.read_header(fh, path.stat().st_size, path.name)
    raw = path.read_bytes()
    assert set(tensors) == set(arrays)
    loaded = safetensors_numpy.load_file(str(path))
    for name, t in tensors.items():
        assert t["shape"] == list(loaded[name].shape)
        assert raw[t["start"] : t["end"]] == loaded[name].tobytes()
    assert tensors["a.weight"]["dtype"] == "F32" and tensors["c.scalar"]["dtype"] == "F16"


def framed(header):
    """8-byte length + the header (a dict as JSON, or raw bytes) + 16 data bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 16


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\x01\x02", "shorter than"),
        (struct.pack("<Q", 1 << 40) + b"{}", "does not fit"),
        (framed(b"{{{{"), "not JSON"),
        (framed(b"[]"), "not a JSON object"),
        (framed({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}), "do not hold"),
        (framed({"x": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}), "unknown dtype"),
        (framed({"x": {"a": 1}}), "no dtype/shape"),
    ],
)
def test_bad_header_is_refused_with_the_file_name(tmp_path, content, words):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with open(path, "rb") as fh, pytest.raises(L.LoaderError) as err:
        L.read_header(fh, path.stat().st_size, "bad.safetensors")
    assert "bad.safetensors" in str(err.value) and words in str(err.value)


def test_tensor_past_the_end_of_the_file(tmp_path):
    path = tmp_path / "short.safetensors"
    write_safetensors(path, {"x": ("F32", [4], b"\0" * 16)})
    path.write_bytes(path.read_bytes()[:-4])
    with open(path, "rb") as fh, pytest.raises(L.LoaderError, match="past the end"):
        L.read_header(fh, path.stat().st_size, path.name)


# --- this rank's part ---------------------------------------------------------------------


def covered(name, shape, itemsize, tp):
    total = math.prod(shape) * itemsize
    seen = bytearray(total)
    per_rank = []
    for rank in range(tp):
        ranges = L.rank_ranges(name, shape, itemsize, tp, rank)
        per_rank.append(sum(n for _o, n in ranges))
        for off, n in ranges:
            for i in range(off, off + n):
                seen[i] += 1
    return seen, per_rank


@pytest.mark.parametrize(
    "name, shape",
    [
        ("model.layers.0.self_attn.q_proj.weight", [8, 6]),
        ("model.layers.0.self_attn.o_proj.weight", [6, 8]),
        ("model.layers.0.mlp.down_proj.weight", [4, 8]),
        ("model.embed_tokens.weight", [8, 3]),
        ("model.padding.0.rotary_emb.inv_freq", [16]),
    ],
)
def test_sharded_tensor_every_byte_on_exactly_one_rank(name, shape):
    seen, per_rank = covered(name, shape, 2, 2)
    assert set(seen) == {1}
    assert per_rank == [len(seen) // 2] * 2


def test_row_parallel_splits_the_last_dimension():
    # o_proj [rows=2, cols=4] bf16, TP=2: rank 1 keeps columns 2-3 of each row
    assert L.rank_ranges("x.o_proj.weight", [2, 4], 2, 2, 1) == [(4, 4), (12, 4)]
    assert L.rank_ranges("x.q_proj.weight", [2, 4], 2, 2, 1) == [(8, 8)]


@pytest.mark.parametrize("name", ["model.norm.weight", "model.layers.3.post_attention_layernorm.weight"])
def test_norms_are_replicated(name):
    seen, per_rank = covered(name, [64], 2, 2)
    assert set(seen) == {2} and per_rank == [128, 128]


def test_tp1_keeps_everything():
    assert L.rank_ranges("x.o_proj.weight", [3, 5], 4, 1, 0) == [(0, 60)]


@pytest.mark.parametrize("n, tp", [(5, 2), (7, 4), (2, 4)])
def test_odd_1d_tensor_ceil_parts(n, tp):
    seen, per_rank = covered("model.padding.6.rotary_emb.inv_freq", [n], 2, tp)
    assert set(seen) == {1}
    part = -(-n // tp)
    assert per_rank[0] == part * 2 and sum(per_rank) == n * 2


def test_indivisible_dimension_is_refused():
    with pytest.raises(L.LoaderError, match=r"dimension 0 \(5\) is not divisible by --tensor-parallel-size 2"):
        L.rank_ranges("x.q_proj.weight", [5, 4], 2, 2, 0)


# --- PyTorch's caching allocator ------------------------------------------------------------


def test_segment_sizes_follow_the_caching_allocator():
    assert L.segment_size(1) == 2 * MIB
    assert L.segment_size(MIB) == 2 * MIB
    assert L.segment_size(MIB + 1) == 20 * MIB
    assert L.segment_size(10 * MIB - 1) == 20 * MIB
    assert L.segment_size(10 * MIB) == 10 * MIB
    assert L.segment_size(11 * MIB) == 12 * MIB


def test_plan_segments_packs_each_pool():
    sizes = [8 * MIB, 8 * MIB, 8 * MIB, 300 * 1024, 300 * 1024, 30 * MIB, 100]
    segments, where = L.plan_segments(sizes)
    # two 8 MiB in one 20 MiB segment, the third opens another; the small ones share a 2 MiB
    # segment (rounded to 512 B); 30 MiB gets its own
    assert segments == [20 * MIB, 20 * MIB, 2 * MIB, 30 * MIB]
    assert where == [(0, 0), (0, 8 * MIB), (1, 0), (2, 0), (2, 300 * 1024), (3, 0), (2, 600 * 1024)]


def test_plan_segments_exact_gives_each_slice_its_own_2m_rounded_segment():
    segments, where = L.plan_segments([8 * MIB, 300 * 1024, 30 * MIB + 1], "exact")
    assert segments == [8 * MIB, 2 * MIB, 32 * MIB]
    assert where == [(0, 0), (1, 0), (2, 0)]


# --- the startup check --------------------------------------------------------------------


def test_startup_check_rule():
    total = 3 * (1 << 30)
    assert L.startup_check(total, total, 0.8) == math.ceil(total * 0.8)
    assert L.startup_check(math.ceil(total * 0.8), total, 0.8) == math.ceil(total * 0.8)
    with pytest.raises(L.LoaderError) as err:
        L.startup_check(math.ceil(total * 0.8) - 1, total, 0.8)
    # the collection's diagnosis reads it as vLLM's startup refusal
    event = _diagnose_parse.parse_journal(str(err.value))["runs"][0]["events"][0]
    assert event["kind"] == "startup_free"
    assert event["utilization"] == 0.8 and event["total_bytes"] == total
    assert event["requested_bytes"] == pytest.approx(total * 0.8, rel=0.01)


def test_human_readable_int_like_vllm():
    f = L.human_readable_int
    assert [f("o", v) for v in ("1k", "1K", "25.6k", "256M", "0.25g", "1024")] == [
        1000, 1024, 25600, 256 * MIB, 250_000_000, 1024,
    ]  # fmt: skip
    for bad in ("1.5K", "lots", "-1", "1X"):
        with pytest.raises(L.OptionError, match="--kv-cache-memory-bytes"):
            f("--kv-cache-memory-bytes", bad)


# --- options --------------------------------------------------------------------------------


def run_loader(*args, timeout=60):
    return subprocess.run(
        [sys.executable, str(LOADER), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_help_says_stand_in():
    res = run_loader("--help")
    assert res.returncode == 0
    assert "STAND-IN for vLLM on a GB10" in res.stdout
    for opt in ("--tensor-parallel-size", "--rank", "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--port"):
        assert opt in res.stdout


@pytest.mark.parametrize(
    "extra, option, value",
    [
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size", "'0'"),
        (["--tensor-parallel-size", "two"], "--tensor-parallel-size", "'two'"),
        (["--tensor-parallel-size", "2", "--rank", "2"], "--rank", "2"),
        (["--rank", "-1"], "--rank", "'-1'"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization", "'1.5'"),
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization", "'0'"),
        (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization", "'nan'"),
        (["--kv-cache-memory-bytes", "1.5G"], "--kv-cache-memory-bytes", "'1.5G'"),
        (["--kv-cache-memory-bytes", "0"], "--kv-cache-memory-bytes", "0"),
        (["--port", "70000"], "--port", "'70000'"),
        (["--driver", "nvidia"], "--driver", "'nvidia'"),
        (["--as-rank", "2"], "--as-rank", "'2'"),
        (["--as-rank", "0:0"], "--as-rank", "'0:0'"),
        (["--as-rank", "2:2"], "--as-rank", "'2:2'"),
        (["--as-rank", "2:-1"], "--as-rank", "'2:-1'"),
    ],
)
def test_bad_option_named_no_traceback(tmp_path, extra, option, value):
    model = tiny_model(tmp_path)
    args = [str(model), "--kv-cache-memory-bytes", "1M", "--driver", "file:%s" % (tmp_path / "dev"), *extra]
    res = run_loader(*args)
    assert res.returncode == 2, res
    assert option in res.stderr and value in res.stderr, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert res.stdout.startswith("(APIServer pid=") and "STAND-IN for vLLM on a GB10" in res.stdout.splitlines()[0]
    assert not (tmp_path / "dev").exists(), "nothing is allocated for a refused option"


def test_rank_bytes_is_load_models_plan_and_as_rank_wins(tmp_path):
    """--rank-bytes prints what load_model pins for this rank (the planner's weights_bytes on the VM), nothing
    allocated; --as-rank overrides the --tensor-parallel-size 1 the collection's planner passes."""
    model = tiny_model(tmp_path)
    res = run_loader(str(model), "--tensor-parallel-size", "1", "--as-rank", "2:1", "--allocator", "exact",
                     "--rank-bytes", "--driver", "file:%s" % (tmp_path / "dev"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)  # only the JSON: no log line before it
    sizes = [sum(n for _o, n in r) for _p, _s, r in L.rank_parts(L.read_headers(str(model)), 2, 1)]
    assert got["tensor_parallel_size"] == 2 and got["rank"] == 1 and got["weights_bytes"] == sum(sizes)
    assert got["weight_driver_bytes"] == sum(L.plan_segments(sizes, "exact")[0]) >= got["weights_bytes"]
    assert not (tmp_path / "dev").exists()
    whole = json.loads(run_loader(str(model), "--rank-bytes", "--allocator", "exact").stdout)
    assert whole["tensor_parallel_size"] == 1 and whole["weights_bytes"] > got["weights_bytes"]


def test_flags_it_does_not_model_are_taken_and_logged(tmp_path):
    """The planner passes vLLM flags the stand-in has no use for: taken (a real vLLM takes them) and listed."""
    args = L.parse_options([str(tiny_model(tmp_path)), "--kv-cache-memory-bytes", "1M", "--max-num-seqs", "4",
                            "--enforce-eager", "--tensor-parallel-size", "1", "--as-rank", "2:0"])  # fmt: skip
    assert args.ignored == ["--max-num-seqs", "4", "--enforce-eager"]
    assert (args.tensor_parallel_size, args.rank) == (2, 0)
    res = run_loader(str(tmp_path / "model"), "--kv-cache-memory-bytes", "1M", "--max-num-seqs", "4",
                     "--driver", "file:%s" % (tmp_path / "d"), "--gpu-memory-utilization", "1.0")  # fmt: skip
    assert "stand-in ignores (not modelled): --max-num-seqs 4" in res.stdout, res.stdout
    res = run_loader(str(tmp_path / "model"), "--driver", "file:%s" % (tmp_path / "d"))
    assert res.returncode == 2 and "--kv-cache-memory-bytes is required" in res.stderr


def test_missing_model_and_driver(tmp_path):
    res = run_loader(str(tmp_path / "nope"), "--kv-cache-memory-bytes", "1M")
    assert res.returncode == 2 and "is not a directory" in res.stderr and "nope" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run_loader(str(empty), "--kv-cache-memory-bytes", "1M", "--driver", "file:%s" % (tmp_path / "d"))
    assert res.returncode == 2 and "config.json cannot be read" in res.stderr
    (empty / "config.json").write_text("{}")
    res = run_loader(str(empty), "--kv-cache-memory-bytes", "1M", "--driver", "file:%s" % (tmp_path / "d"))
    assert res.returncode == 2 and "no *.safetensors" in res.stderr
    assert "Traceback" not in res.stderr
    model = tiny_model(tmp_path)
    res = run_loader(str(model), "--kv-cache-memory-bytes", "1M")
    if os.path.exists(sys.modules["uma_loader_drivers"].DEV):
        pytest.skip("this machine has /dev/fakegb10")
    assert res.returncode == 2 and "--driver fakegb10" in res.stderr and "lab/vm.sh module" in res.stderr


def test_driver_ioctl_number_is_the_checked_one():
    # test_vm_lab.py checks fakegb10_alloc.py's number against fakegb10_uapi.h compiled by gcc
    spec = importlib.util.spec_from_file_location("fakegb10_alloc", ROOT / "lab" / "vm" / "fakegb10_alloc.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    drivers = sys.modules["uma_loader_drivers"]
    assert (drivers.IOC_ALLOC, drivers.ALLOC_FMT) == (tool.IOC_ALLOC, tool.ALLOC_FMT)


# --- a whole run ----------------------------------------------------------------------------


def fake_proc(tmp_path, avail_kib, total_kib=3 * 1024 * 1024):
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "meminfo").write_text("MemTotal: %d kB\nMemFree: 1000 kB\nMemAvailable: %d kB\n" % (total_kib, avail_kib))
    (proc / "buddyinfo").write_text("Node 0, zone   Normal  1 2 3 4 5 6 7 8 9 17 4\n")
    return proc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_in_thread(argv, driver, proc):
    out = io.StringIO()
    result = {}
    old = sys.stdout

    def target():
        result["rc"] = L.main(argv, driver=driver, proc=str(proc))

    sys.stdout = out
    try:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(20)
    finally:
        sys.stdout = old
    return result.get("rc"), out.getvalue()


def test_startup_check_refuses_before_anything_is_allocated(tmp_path):
    model = tiny_model(tmp_path)
    proc = fake_proc(tmp_path, avail_kib=2 * 1024 * 1024)  # 2 of 3 GiB available, 0.8 asked
    driver = L.PlainFileDriver(str(tmp_path / "dev"))
    rc, out = run_in_thread(
        [str(model), "--kv-cache-memory-bytes", "1M", "--gpu-memory-utilization", "0.8"], driver, proc
    )
    assert rc == 1
    assert driver.end == 0, "vLLM checks before the weights are allocated"
    run = _diagnose_parse.parse_journal(out)["runs"][0]
    kinds = [e["kind"] for e in run["events"]]
    assert "startup_free" in kinds and "engine_failed" in kinds and not run["healthy"]
    assert '"memavailable_at_check": %d' % (2 << 30) in out


def test_driver_out_of_memory_is_torchs_oom(tmp_path):
    model = tiny_model(tmp_path)
    proc = fake_proc(tmp_path, avail_kib=3 * 1024 * 1024)
    driver = L.PlainFileDriver(str(tmp_path / "dev"), limit=23 * MIB)  # weights (2 + 20 MiB) fit, the KV cache does not
    rc, out = run_in_thread([str(model), "--kv-cache-memory-bytes", "16M", "--tensor-parallel-size", "2"], driver, proc)
    assert rc == 1, out
    run = _diagnose_parse.parse_journal(out)["runs"][0]
    oom = next(e for e in run["events"] if e["kind"] == "cuda_oom")
    assert oom["tried_bytes"] == 16 * MIB and oom["total_bytes"] == 3 << 30
    assert "KV cache" in oom["line"] and "Loading weights took" in out
    facts = json.loads(out.split("stand-in facts: ", 1)[1].splitlines()[0])
    assert facts["driver"] == {} and facts["weight_driver_bytes"] == 22 * MIB  # the counters also on failure
    # vLLM's own "non-default args" line: the diagnosis names the explicit KV size from it
    args = next(e for e in run["events"] if e["kind"] == "engine_args")["args"]
    assert _diagnose_parse.flags_from_args(args) == {
        "kv_cache_memory_bytes": str(16 * MIB),
        "tensor_parallel_size": "2",
        "gpu_memory_utilization": "0.9",
    }


def test_whole_run_over_http(tmp_path):
    model = tiny_model(tmp_path)
    dev = tmp_path / "dev"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(LOADER), str(model), "--tensor-parallel-size", "2", "--rank", "1",
         "--gpu-memory-utilization", "0.01", "--kv-cache-memory-bytes", "2M", "--port", str(port),
         "--host", "127.0.0.1", "--driver", "file:%s" % dev, "--max-model-len", "128"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as r:
                    status = r.status
                break
            except OSError:
                time.sleep(0.1)
        assert status == 200, proc.poll()
        req = urllib.request.Request(
            "http://127.0.0.1:%d/v1/completions" % port,
            data=json.dumps({"model": str(model), "prompt": "ping", "max_tokens": 3}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            body = json.loads(r.read())
        assert body["object"] == "text_completion" and len(body["choices"]) == 1
        assert body["usage"] == {"prompt_tokens": 1, "total_tokens": 4, "completion_tokens": 3}
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
            metrics = r.read().decode()
        assert 'vllm:request_success_total{model_name="%s"} 1.0' % model in metrics
        bad = urllib.request.Request(
            "http://127.0.0.1:%d/v1/completions" % port, data=json.dumps({"model": "other"}).encode()
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=5)
        assert err.value.code == 404
    finally:
        proc.terminate()
        out, _err = proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    lines = out.splitlines()
    assert "STAND-IN for vLLM on a GB10" in lines[0]
    run = _diagnose_parse.parse_journal(out)["runs"][0]
    assert run["healthy"] and not run["ooms"]
    kinds = {e["kind"]: e for e in run["events"]}
    # 2 (K, V) x 1 layer x 1 KV head per rank x head_dim 16 x 2 bytes = 64 B/token: 2 MiB = 32768 tokens
    assert kinds["kv_size"]["tokens"] == 32768 and kinds["kv_size"]["max_concurrency"] == 256.0
    assert "weights" in kinds and "Loading weights took" in out

    # rank 1's bytes in the driver file: the segments are laid out in tensor order (file 1, file 2)
    raw = dev.read_bytes()
    emb = pattern(8 * 64 * 2, 1)[512:]  # rows 4-7 of [8, 64] bf16
    o_full = pattern(64 * 64 * 2, 2)
    o_proj = b"".join(o_full[r * 128 + 64 : r * 128 + 128] for r in range(64))  # columns 32-63
    norm = pattern(128, 3)
    pad = pattern(6 * MIB, 4)[3 * MIB :]
    norm2 = pattern(256, 5)
    # small pool (<= 1 MiB, rounded to 512 B) shares one 2 MiB segment, the 3 MiB tensor has a 20 MiB one
    assert raw[: len(emb)] == emb
    assert raw[512 : 512 + len(o_proj)] == o_proj
    assert raw[512 + 4096 : 512 + 4096 + 128] == norm
    assert raw[512 + 4096 + 512 : 512 + 4096 + 512 + 256] == norm2
    assert raw[2 * MIB : 2 * MIB + len(pad)] == pad
    assert len(raw) == 2 * MIB + 20 * MIB + 2 * MIB  # + the KV cache


def test_driver_cuda_without_a_gpu_is_named_not_a_traceback(tmp_path):
    # no GPU here or in CI (the cuda driver ran on the lent H200: benchmarks/gpu_launch_check.py)
    model = tiny_model(tmp_path)
    res = run_loader(str(model), "--kv-cache-memory-bytes", "1M", "--driver", "cuda")
    assert res.returncode == 2, res
    assert "--driver cuda" in res.stderr and ("PyTorch" in res.stderr or "is_available" in res.stderr), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
