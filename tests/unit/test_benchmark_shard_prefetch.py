"""benchmarks/shard_prefetch.py (an experiment beside a loader, not part of the collection): its decisions
from successive /proc/PID/maps readings, and one real run beside a real mmap reader."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "shard_prefetch.py"
spec = importlib.util.spec_from_file_location("shard_prefetch", SCRIPT)
sp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sp)

FILES = ["/m/model-0000%d-of-00004.safetensors" % i for i in range(1, 5)]


def _prefetcher(ahead=1):
    calls = []
    pf = sp.Prefetcher(FILES, ahead, lambda p: calls.append(("prefetch", p)), lambda p: calls.append(("evict", p)))
    return pf, calls


def test_one_ahead_of_the_mapped_shard_and_each_consumed_one_evicted():
    pf, calls = _prefetcher()
    pf.start(first=True)
    assert calls == [("prefetch", FILES[0])]
    pf.tick(set())
    pf.tick({FILES[0]})
    assert calls[-1] == ("prefetch", FILES[1])
    pf.tick({FILES[0]})  # nothing new
    pf.tick({FILES[1]})  # shard 0 unmapped: evicted; shard 2 read ahead
    assert calls[-2:] == [("prefetch", FILES[2]), ("evict", FILES[0])]
    pf.tick({FILES[2]})
    pf.tick({FILES[3]})
    pf.tick(set())
    assert [c for c in calls if c[0] == "prefetch"] == [("prefetch", f) for f in FILES]  # each once
    assert [c for c in calls if c[0] == "evict"] == [("evict", f) for f in FILES]
    assert pf.done()


def test_a_shard_no_reading_saw_is_evicted_too_and_never_prefetched_late():
    pf, calls = _prefetcher(ahead=2)
    pf.start(first=False)
    pf.tick({FILES[2]})  # 0 and 1 came and went between two reads
    assert ("prefetch", FILES[3]) in calls and ("prefetch", FILES[0]) not in calls
    assert ("evict", FILES[0]) in calls and ("evict", FILES[1]) in calls
    assert ("prefetch", FILES[1]) not in calls
    assert not pf.done()
    pf.tick({FILES[3]})
    pf.tick(set())
    assert pf.done()


def test_ahead_zero_only_evicts():
    pf, calls = _prefetcher(ahead=0)
    pf.start(first=True)
    pf.tick({FILES[0]})
    pf.tick({FILES[1]})
    assert calls == [("evict", FILES[0])]


def test_maps_parsing_and_shard_order(tmp_path):
    for name in ("b.safetensors", "a.safetensors", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.safetensors").write_bytes(b"x")
    files = sp.shard_files([str(tmp_path)])
    assert [os.path.basename(f) for f in files] == ["a.safetensors", "b.safetensors", "c.safetensors"]
    maps = (
        "7f00-7f10 r--s 00000000 fd:01 12 %s\n"
        "7f10-7f20 r--s 00000000 fd:01 13 %s (deleted)\n"
        "7f20-7f30 r-xp 00000000 fd:01 14 /usr/lib/libc.so.6\n"
        "7f30-7f40 rw-p 00000000 00:00 0\n" % (files[0], files[2])
    )
    assert sp.mapped_files(maps, set(files)) == {files[0], files[2]}


READER = r"""
import mmap, os, sys, time
for path in sys.argv[1:]:
    with open(path, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    for off in range(0, len(m), 4096):
        m[off]
    time.sleep(0.3)
    m.close()
    time.sleep(0.1)
"""


def test_a_real_run_beside_a_real_mmap_reader(tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / ("model-%d.safetensors" % i)
        path.write_bytes(os.urandom(2 << 20))
        paths.append(str(path))
    reader = subprocess.Popen([sys.executable, "-c", READER, *paths])
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--pid", str(reader.pid), "--paths", str(tmp_path), "--first"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    reader.wait(timeout=30)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["shards"] == 3 and result["stop"] in ("every shard consumed", "loader exited")
    what = [(e["what"], e["shard"]) for e in result["events"]]
    assert ("prefetch", "model-0.safetensors") in what and ("prefetch", "model-2.safetensors") in what
    assert [s for w, s in what if w == "evict"] == ["model-0.safetensors", "model-1.safetensors",
                                                    "model-2.safetensors"]  # fmt: skip
    assert all(e.get("error") is None for e in result["events"])


def test_bad_arguments_exit_2(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--pid", "1", "--paths", str(tmp_path)],
                         check=False, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert res.returncode == 2 and "no .safetensors files" in res.stderr
    res = subprocess.run([sys.executable, str(SCRIPT), "--pid", "1", "--paths", str(tmp_path), "--ahead", "-1"],
                         check=False, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert res.returncode == 2


def test_the_vm_and_page_cache_harnesses_run_it():
    assert "p" in open(ROOT / "benchmarks" / "uma_vm.py").read().split("CONFIGS = ", 1)[1].split("\n", 1)[0]
    text = (ROOT / "benchmarks" / "page_cache.py").read_text()
    assert '"prefetch": (["--ahead", "1", "--first"], None)' in text
