"""Pure parts of the page-cache guard: arguments, meminfo, policy, files, devices, stop conditions."""

from __future__ import annotations

import json
import os
import struct
import threading

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.guard import config as _guard_config
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import memory as _guard_memory
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import program as g
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import residency as _guard_residency
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import sweeper as _guard_sweeper
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import watch as _guard_watch

MIB = 1 << 20
KEYS = (
    "name mode pid state started_at stopped_at elapsed_s ticks evictions evicted_bytes baseline_cache_mib "
    "peak_cache_mib peak_growth_mib peak_mapped_mib min_available_mib cpu_seconds stop_reason config"
).split()


# --------------------------------------------------------------------------
# arguments


def test_defaults():
    cfg = g.parse_config(["--name", "x", "--mode", "global"])
    assert cfg["mode"] == "global"
    assert cfg["interval"] == 0.1
    assert cfg["drop_level"] == 1
    assert cfg["max_duration"] == 900
    assert cfg["threshold_mib"] == _guard_config.DEFAULT_THRESHOLD_MIB
    assert cfg["proc_root"] == "/proc"
    assert g.parse_config(["--name", "x", "--paths", "."])["mode"] == _guard_config.DEFAULT_MODE
    assert _guard_config.DEFAULT_MODE in _guard_config.MODES


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mode", "files"], "'--paths' = []: is empty but mode=files"),
        (["--mode", "global", "--paths", "."], "has no effect with mode=global"),
        (["--interval", "0"], "must be > 0 and <= 60"),
        (["--interval", "-1"], "must be > 0 and <= 60"),
        (["--interval", "61"], "must be > 0 and <= 60"),
        (["--max-duration", "0"], "--max-duration"),
        (["--threshold-mib", "0"], "--threshold-mib"),
        (["--min-available-mib", "-5"], "--min-available-mib"),
        (["--paths", "/nonexistent/uma"], "does not exist"),
        (["--until-url", "localhost:8000/health"], "not an http(s) URL"),
        (["--until-pid", "0"], "positive process id"),
        (["--mode", "bogus"], "invalid choice"),
        (["--drop-level", "2"], "is not 1 or 3"),
        (["--interval", "fast"], "is not a number"),
        # argparse's int() and float() take any Unicode digit: U+FF11 (a fullwidth 1) was a silent 1
        (["--threshold-mib", "\uff11"], "is not an integer"),
        (["--interval", "\uff11"], "digits 0-9 only"),
        (["--drop-level", "\uff13"], "is not an integer"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        g.parse_config(["--name", "x", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_name_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        g.parse_config(["--mode", "global"])
    assert exc.value.code == 2
    assert "--name" in capsys.readouterr().err


def test_paths_become_absolute(tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = g.parse_config(["--name", "x", "--mode", "files", "--paths", "ckpt", "--status-file", "s.json"])
    assert cfg["paths"] == [str(tmp_path / "ckpt")]
    assert cfg["status_file"] == str(tmp_path / "s.json")


# --------------------------------------------------------------------------
# meminfo


MEMINFO = (
    "MemTotal:       24684132 kB\nMemFree:        20000000 kB\nMemAvailable:   22000000 kB\n"
    "Buffers:            1000 kB\nCached:          3000000 kB\nSwapCached:           7 kB\n"
    "Dirty:               100 kB\nAnonPages:        500000 kB\nMapped:           200000 kB\n"
    "HugePages_Total:       0\n"
)


def test_parse_meminfo_fields_picks_exact_keys():
    found = _guard_memory.parse_meminfo_fields(
        b"\n" + MEMINFO.encode(), _guard_memory.MeminfoReader(keys=_guard_memory.MeminfoReader.KEYS).patterns
    )
    assert found == {
        "MemFree": 20000000 * 1024,
        "MemAvailable": 22000000 * 1024,
        "Cached": 3000000 * 1024,  # not SwapCached
        "Mapped": 200000 * 1024,
        "AnonPages": 500000 * 1024,
        "Dirty": 100 * 1024,
    }


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\nHugePages_Total:       3\n", {"HugePages_Total": 3}),  # no unit: a count
        ("\nHugePages_Total: x\n", {}),
        ("\nHugePages_Total:\n", {}),
        ("\nHugePages_Total: 5", {"HugePages_Total": 5}),  # last line without newline
    ],
)
def test_parse_meminfo_fields_edge_cases(text, expected):
    assert _guard_memory.parse_meminfo_fields(text.encode(), [("HugePages_Total", b"\nHugePages_Total:")]) == expected


def test_meminfo_reader_reads_a_replaced_file_and_falls_back(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    reader = _guard_memory.MeminfoReader(str(tmp_path))
    assert set(reader.read()) == set(_guard_memory.MeminfoReader.TICK_KEYS)
    assert reader.read()["Cached"] == 3000000 * 1024
    (tmp_path / "meminfo").write_text(MEMINFO.replace("3000000", "4000000"))
    assert reader.read()["Cached"] == 4000000 * 1024
    # without Mapped the fast path gives up and _common.read_meminfo answers (all keys)
    (tmp_path / "meminfo").write_text(MEMINFO.replace("Mapped:", "Mappd:"))
    full = reader.read()
    assert "MemTotal" in full and "Mapped" not in full
    reader.close()


def test_meminfo_reader_on_the_real_proc():
    reader = _guard_memory.MeminfoReader("/proc")
    first = reader.read()
    second = reader.read()
    reader.close()
    for key in ("MemFree", "Cached", "Mapped", "MemAvailable"):
        assert first[key] > 0 and second[key] > 0
    assert first["MemFree"] <= g.read_meminfo("/proc")["MemTotal"]


@pytest.mark.parametrize(
    "meminfo, expected",
    [
        (
            {"Cached": 10, "Mapped": 4, "MemAvailable": 7, "MemFree": 2},
            {"cached": 10, "mapped": 4, "unmapped": 6, "available": 7, "free": 2},
        ),
        (
            {"Cached": 3, "Mapped": 5, "MemFree": 9},
            {"cached": 3, "mapped": 5, "unmapped": 0, "available": 9, "free": 9},
        ),
        ({}, {"cached": 0, "mapped": 0, "unmapped": 0, "available": 0, "free": 0}),
    ],
)
def test_cache_view(meminfo, expected):
    assert _guard_memory.cache_view(meminfo) == expected


def test_sample_record_has_the_timeline_keys():
    record = _guard_memory.sample_record(12.34567, {"Cached": 5, "Mapped": 2, "MemAvailable": 9, "Foo": 1})
    assert record == {"t": 12.346, "MemAvailable": 9, "Cached": 5, "Mapped": 2, "AnonPages": 0, "Dirty": 0}


# --------------------------------------------------------------------------
# adaptive policy and tick


@pytest.mark.parametrize(
    "unmapped, reference, rate, expected",
    [
        (0, 0, 0.0, 0.1),  # idle: the interval
        (0, 0, -1e9, 0.1),  # shrinking: the interval
        (0, 0, 32 * MIB / 0.02, 0.02),  # 32 MiB headroom at 1.6 GB/s -> 20 ms
        (0, 0, 32 * MIB / 0.05, 0.05),
        (16 * MIB, 0, 32 * MIB / 0.05, 0.025),  # half the headroom left
        (0, 0, 32 * MIB / 0.005, 0.01),  # crossing in 5 ms: MIN_TICK_S
        (0, 0, 1.0, 0.1),  # slow growth never sleeps longer than the interval
        (40 * MIB, 0, 1e6, 0.01),  # already past the threshold: shortest tick
        (0, 0, 1e12, 0.01),  # never below MIN_TICK_S
    ],
)
def test_next_sleep(unmapped, reference, rate, expected):
    assert _guard_memory.next_sleep(unmapped, reference, 32 * MIB, rate, 0.1) == pytest.approx(expected)


def test_next_sleep_never_exceeds_a_short_interval():
    assert _guard_memory.next_sleep(0, 0, 32 * MIB, 0.0, 0.005) == 0.005
    assert _guard_memory.next_sleep(40 * MIB, 0, 32 * MIB, 1e6, 0.005) == 0.005


@pytest.mark.parametrize(
    "ra_kb, expected_mib",
    [(None, 17), (8192, 17), (128, 4), (0, 4), (4096, 9), (-1, 17), (65536, 129)],
)
def test_keep_bytes(ra_kb, expected_mib):
    assert _guard_sweeper.keep_bytes(ra_kb) == expected_mib * MIB


def _view(unmapped, available=10**12, free=10**12):
    return {"cached": unmapped, "mapped": 0, "unmapped": unmapped, "available": available, "free": free}


@pytest.mark.parametrize(
    "levels, expected",
    [
        # (unmapped MiB per tick) -> trigger per tick; threshold 32 MiB above the running minimum
        ([100, 120, 131, 132], [None, None, None, "growth"]),
        ([100, 60, 80, 92], [None, None, None, "growth"]),  # the reference follows the cache down
        ([100, 99, 98, 97], [None, None, None, None]),
        ([100, 500], [None, "growth"]),
    ],
)
def test_adaptive_policy_growth(levels, expected):
    policy = _guard_memory.AdaptivePolicy(32, 0, levels[0] * MIB)
    got = [policy.observe(float(i), _view(level * MIB)) for i, level in enumerate(levels)]
    assert got == expected


def test_adaptive_policy_does_not_refire_on_cache_it_cannot_free():
    policy = _guard_memory.AdaptivePolicy(32, 0, 0)
    assert policy.observe(0.0, _view(100 * MIB)) == "growth"
    # the sweep freed nothing (another workload's cache): the new level is the reference
    policy.acted(0.0, "growth", _view(100 * MIB), _view(100 * MIB))
    assert [policy.observe(t, _view(110 * MIB)) for t in (1.0, 2.0, 3.0)] == [None, None, None]
    assert policy.observe(4.0, _view(133 * MIB)) == "growth"


def test_adaptive_policy_available_trigger_backs_off_when_useless():
    policy = _guard_memory.AdaptivePolicy(32, 1000, 0)
    low = _view(0, available=500 * MIB)
    assert policy.observe(0.0, low) == "available"
    policy.acted(0.0, "available", low, low)  # freed nothing
    assert policy.observe(0.5, low) is None  # backs off 1 s
    assert policy.observe(1.0, low) == "available"
    policy.acted(1.0, "available", low, low)
    assert policy.observe(2.5, low) is None  # now 2 s
    assert policy.observe(3.0, low) == "available"
    # a useful action resets the back-off
    policy.acted(3.0, "available", low, _view(0, available=600 * MIB))
    assert policy.observe(3.01, low) == "available"
    assert _guard_memory.AdaptivePolicy(32, 0, 0).observe(0.0, low) is None  # 0 = trigger off


def test_adaptive_policy_holds_growth_while_memfree_is_above_the_line():
    policy = _guard_memory.AdaptivePolicy(32, 0, 100 * MIB, act_below_free_mib=1000)
    # grown 400 MiB, but 2000 MiB free: held, not acted on, and counted
    assert policy.observe(0.0, _view(500 * MIB, free=2000 * MIB)) is None
    assert policy.held and policy.held_ticks == 1
    assert policy.observe(0.1, _view(600 * MIB, free=1000 * MIB)) is None  # at the line: still held
    assert policy.held_ticks == 2
    # below the line: all the growth since the last action counts (the reference did not move)
    assert policy.observe(0.2, _view(700 * MIB, free=999 * MIB)) == "growth"
    assert not policy.held and policy.held_ticks == 2
    # no growth: neither held nor acted, whatever MemFree says
    policy.acted(0.2, "growth", _view(700 * MIB), _view(100 * MIB))
    assert policy.observe(0.3, _view(110 * MIB, free=5000 * MIB)) is None and not policy.held
    # the line does not touch the MemAvailable trigger
    low = _view(0, available=10 * MIB, free=5000 * MIB)
    assert _guard_memory.AdaptivePolicy(32, 100, 0, act_below_free_mib=1000).observe(0.0, low) == "available"
    # 0: every growth acts, the view's MemFree never read
    assert _guard_memory.AdaptivePolicy(32, 0, 0).observe(0.0, {"unmapped": 64 * MIB, "available": 1}) == "growth"


@pytest.mark.parametrize(
    "headroom, rate, expected",
    [(100 * MIB, 0.0, 0.1), (100 * MIB, -5.0, 0.1), (0, 1e9, 0.01), (-1, 1e9, 0.01), (10 * MIB, 200 * MIB, 0.05),
     (10 * MIB, 1e12, 0.01), (10**12, 1.0, 0.1)],
)  # fmt: skip
def test_sleep_until(headroom, rate, expected):
    assert _guard_memory.sleep_until(headroom, rate, 0.1) == pytest.approx(expected)


def test_adaptive_policy_backoff_is_capped():
    policy = _guard_memory.AdaptivePolicy(32, 1000, 0)
    low = _view(0, available=1)
    now = 0.0
    for _unused in range(12):
        policy.acted(now, "available", low, low)
        now = policy.not_before
    assert policy.backoff == _guard_memory.AdaptivePolicy.BACKOFF_MAX_S


# --------------------------------------------------------------------------
# files and devices


def test_iter_files_walks_dedupes_and_skips(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "a.safetensors").write_bytes(b"x" * 10)
    (ckpt / "sub" / "b.bin").write_bytes(b"y" * 20)
    (ckpt / "empty.json").write_bytes(b"")
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "sha").write_bytes(b"z" * 30)
    (ckpt / "link.safetensors").symlink_to(blobs / "sha")
    (ckpt / "dangling").symlink_to(tmp_path / "missing")
    os.link(ckpt / "a.safetensors", ckpt / "hardlink")
    found = g.iter_files([str(ckpt), str(blobs / "sha"), str(tmp_path / "missing")])
    sizes = sorted(size for _unused, size, _unused, _unused in found)
    assert sizes == [10, 20, 30]  # empty skipped, blob once, hardlink once
    assert len({(dev, ino) for _unused, _unused, dev, ino in found}) == 3


def _fake_sysfs(tmp_path, partition):
    sysfs = tmp_path / "sys"
    disk = sysfs / "devices" / "pci0000:00" / "virtio1" / "block" / "vda"
    (disk / "queue").mkdir(parents=True)
    (disk / "queue" / "read_ahead_kb").write_text("8192\n")
    (disk / "stat").write_text("1 2 3\n")
    part = disk / "vda1"
    part.mkdir()
    (part / "partition").write_text("1\n")
    (sysfs / "dev" / "block").mkdir(parents=True)
    os.symlink("../../devices/pci0000:00/virtio1/block/vda", sysfs / "dev" / "block" / "253:0")
    os.symlink("../../devices/pci0000:00/virtio1/block/vda/vda1", sysfs / "dev" / "block" / "253:1")
    return sysfs, disk


@pytest.mark.parametrize("minor", [0, 1])
def test_block_queue_dir_resolves_partitions_to_the_disk(tmp_path, minor):
    sysfs, disk = _fake_sysfs(tmp_path, minor)
    dev = os.makedev(253, minor)
    assert _guard_residency.block_queue_dir(dev, str(sysfs)) == str(disk / "queue")
    assert _guard_residency.read_ahead_kb(dev, str(sysfs)) == 8192


def test_block_queue_dir_without_a_block_device(tmp_path):
    sysfs, _unused = _fake_sysfs(tmp_path, 0)
    assert _guard_residency.block_queue_dir(os.makedev(0, 42), str(sysfs)) is None
    assert _guard_residency.read_ahead_kb(os.makedev(0, 42), str(sysfs)) is None


def _bitmap_counter(bitmap):
    return lambda first: sum(bitmap[first:])


@pytest.mark.parametrize(
    "bitmap",
    [
        [0] * 1000,
        [1] * 1000,
        [0] * 500 + [1] * 100 + [0] * 400,
        [1] * 10 + [0] * 990,
        [0] * 999 + [1],
        [1, 0, 1] + [0] * 700 + [1] * 3 + [0] * 294,
        [1],
        [],
    ],
)
@pytest.mark.parametrize("resolution", [1, 64])
def test_last_resident_end_brackets_the_truth(bitmap, resolution):
    truth = max((i + 1 for i, bit in enumerate(bitmap) if bit), default=0)
    end = _guard_residency.last_resident_end(_bitmap_counter(bitmap), len(bitmap), resolution)
    if truth == 0:
        assert end == 0
    else:
        assert truth <= end <= truth + max(1, resolution)
        assert end <= len(bitmap)


class FakeResidency:
    """Residency of fake files: a dict fd -> resident bytes; 'fadvise' drops a prefix."""

    page_size = 4096

    def __init__(self):
        self.ranges = {}  # fd -> (start, end) of the resident range
        self.pinned = {}  # fd -> bytes that cannot be evicted (mapped, at the start)
        self.end_calls = 0

    def resident_bytes(self, fd, size):
        start, end = self.ranges[fd]
        return max(0, end - start) + self.pinned.get(fd, 0)

    def pages(self, fd, size, offset=0):
        start, end = self.ranges[fd]
        return (max(0, end - max(start, offset)) + max(0, self.pinned.get(fd, 0) - offset)) // self.page_size

    def resident_end(self, fd, size, hint=None):
        self.end_calls += 1
        return self.ranges[fd][1]


@pytest.fixture
def sweeper(monkeypatch):
    res = FakeResidency()
    advised = []

    def fake_fadvise(fd, offset=0, length=0):
        advised.append((fd, offset, length))
        start, end = res.ranges[fd]
        stop = end if length == 0 else offset + length
        if offset <= start:
            res.ranges[fd] = (min(max(start, stop), end), end) if stop < end else (end, end)

    monkeypatch.setattr(_guard_sweeper, "fadvise_dontneed", fake_fadvise)
    sw = _guard_sweeper.FileSweeper([], residency=res)
    sw.keep_by_dev[1] = 16 * MIB
    return sw, res, advised


def test_advise_skips_a_file_below_its_floor(sweeper):
    sw, res, advised = sweeper
    st = {"floor": 0, "seen": 0, "tail": False, "end": None}
    res.ranges[3] = (0, MIB // 2)
    assert sw.advise(3, 1 << 30, 1, st) == (0, 0, False)
    assert advised == []


def test_advise_keeps_the_readahead_tail_of_a_growing_file_then_evicts_it(sweeper):
    sw, res, advised = sweeper
    st = {"floor": 0, "seen": 0, "tail": False, "end": None}
    size = 1 << 30
    res.ranges[3] = (0, 100 * MIB)  # being read: grew since last look
    done, freed, kept = sw.advise(3, size, 1, st)
    assert (done, kept) == (1, True)
    assert advised[-1] == (3, 0, 84 * MIB)  # everything but the last 16 MiB
    assert freed == 84 * MIB
    assert res.resident_bytes(3, size) == 16 * MIB
    assert st["mapped"] is False  # it freed what it advised: not taken for a mapped file
    # the reader moved on: no growth, so the next sweep evicts the whole file
    done, freed, kept = sw.advise(3, size, 1, st)
    assert (done, freed, kept) == (1, 16 * MIB, False)
    assert advised[-1] == (3, 0, 0)
    assert st["tail"] is False and st["floor"] == 0


def test_advise_small_growth_inside_the_keep_window_waits(sweeper):
    sw, res, advised = sweeper
    st = {"floor": 0, "seen": 0, "tail": False, "end": None}
    res.ranges[3] = (0, 10 * MIB)  # less than the 16 MiB window
    assert sw.advise(3, 1 << 30, 1, st) == (0, 0, True)
    assert advised == []
    assert st["tail"] is True  # so the idle clean-up comes back for it


def test_advise_learns_the_mapped_floor(sweeper):
    sw, res, advised = sweeper
    st = {"floor": 0, "seen": 0, "tail": False, "end": None}
    size = 64 * MIB
    res.ranges[3] = (0, 0)
    res.pinned[3] = 40 * MIB  # mapped by the loader: fadvise cannot drop it
    st["seen"] = 40 * MIB  # not growing
    assert sw.advise(3, size, 1, st)[0] == 1
    assert st["floor"] == 40 * MIB
    calls = len(advised)
    # same residency again: below floor + step, no syscall spent on it
    assert sw.advise(3, size, 1, st) == (0, 0, False)
    assert len(advised) == calls


class MappedFile:
    """A file an mmap loader maps from the start: mapped pages cannot be evicted until it unmaps."""

    page_size = 4096

    def __init__(self):
        self.mapped = 0  # bytes [0, mapped) resident and mapped
        self.unmapped = False
        self.advised = []

    def resident_bytes(self, fd, size):
        return self.mapped

    def pages(self, fd, size, offset=0):
        return max(0, self.mapped - offset) // self.page_size

    def resident_end(self, fd, size, hint=None):
        return self.mapped

    def fadvise(self, fd, offset=0, length=0):
        self.advised.append((offset, length))
        if self.unmapped:  # the range goes
            stop = self.mapped if length == 0 else min(self.mapped, offset + length)
            if offset == 0:
                self.mapped = max(0, self.mapped - stop) if stop < self.mapped else 0


def test_advise_probes_a_growing_mapped_file_instead_of_walking_it(monkeypatch):
    res = MappedFile()
    monkeypatch.setattr(_guard_sweeper, "fadvise_dontneed", res.fadvise)
    sw = _guard_sweeper.FileSweeper([], residency=res)
    sw.keep_by_dev[1] = 16 * MIB
    st = {"floor": 0, "seen": 0, "tail": False, "end": None}
    size = 1 << 30
    res.mapped = 100 * MIB
    assert sw.advise(3, size, 1, st) == (1, 0, True)  # tried [0, 84 MiB): nothing freed
    assert res.advised[-1] == (0, 84 * MIB)
    assert st["mapped"] is True
    res.mapped = 200 * MIB  # still faulting in
    assert sw.advise(3, size, 1, st) == (0, 0, True)
    assert res.advised[-1] == (0, _guard_sweeper.PROBE_BYTES)  # only the probe
    # the loader unmaps it (and has moved on): the probe frees, the whole file goes at once
    res.mapped = 300 * MIB
    res.unmapped = True
    assert sw.advise(3, size, 1, st) == (1, 300 * MIB, False)  # the probe's 4 MiB and the rest
    assert res.advised[-2:] == [(0, _guard_sweeper.PROBE_BYTES), (0, 0)]
    assert res.mapped == 0
    assert st["mapped"] is False


def test_advise_without_a_residency_method_advises_whole_files(monkeypatch):
    advised = []
    monkeypatch.setattr(
        _guard_sweeper, "fadvise_dontneed", lambda fd, offset=0, length=0: advised.append((fd, offset, length))
    )

    class Blind:
        page_size = 4096

        def resident_bytes(self, fd, size):
            return None

    sw = _guard_sweeper.FileSweeper([], residency=Blind())
    assert sw.advise(7, 100, 1, {"floor": 0, "seen": 0, "tail": False, "end": None}) == (1, 0, False)
    assert advised == [(7, 0, 0)]


@pytest.mark.parametrize(
    "state, touched, expected",
    [
        (None, set(), True),  # never looked at
        ({"floor": 0, "seen": 0, "tail": False}, set(), False),  # empty, untouched: skipped
        ({"floor": 0, "seen": 0, "tail": False}, {(1, 2)}, True),  # the loader used it
        ({"floor": 0, "seen": 0, "tail": False}, None, True),  # full scan
        ({"floor": 0, "seen": 5 * MIB, "tail": False}, set(), True),  # still held pages
        ({"floor": 5 * MIB, "seen": 5 * MIB, "tail": False}, set(), False),  # only its mapped floor
        ({"floor": 0, "seen": 0, "tail": True}, set(), True),  # a kept tail to evict
    ],
)
def test_sweep_candidates(state, touched, expected):
    sw = _guard_sweeper.FileSweeper([])
    if state is not None:
        sw.state[(1, 2)] = state
    assert sw.candidate((1, 2), touched) is expected


def test_sweep_looks_only_at_candidates_between_full_scans(tmp_path, monkeypatch):
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(b"x" * 100)
    res = FakeResidency()
    res.ranges = {}
    seen = []

    def resident_bytes(fd, size):
        seen.append(fd)
        return 0

    res.resident_bytes = resident_bytes
    sw = _guard_sweeper.FileSweeper([str(tmp_path)], residency=res)
    sw.sweep(100.0, set())  # the first sweep is a full scan
    assert len(seen) == 3
    seen.clear()
    key_b = next((dev, ino) for path, _unused, dev, ino in sw.files if path.endswith("b"))
    sw.sweep(100.5, {key_b})
    assert seen == [sw.fds[key_b]]
    seen.clear()
    sw.sweep(101.5, set())  # FULL_SCAN_S later: everything again
    assert len(seen) == 3
    sw.close()
    assert sw.fds == {}


def test_file_events_drain_parses_events(tmp_path):
    events = _guard_watch.FileEvents()
    if events.fd is None:
        pytest.skip("no inotify")
    os.close(events.fd)
    r, w = os.pipe()
    os.set_blocking(r, False)
    events.fd = r
    events.keys = {1: (8, 100), 2: (8, 200)}
    name = b"x\0\0\0"
    os.write(w, struct.pack("iIII", 1, 0x20, 0, 0) + struct.pack("iIII", 2, 0x1, 0, len(name)) + name)
    os.write(w, struct.pack("iIII", 9, 0x1, 0, 0))  # unknown watch: ignored
    assert events.drain() == {(8, 100), (8, 200)}
    assert events.drain() == set()
    os.write(w, struct.pack("iIII", -1, _guard_watch.FileEvents.IN_Q_OVERFLOW, 0, 0))
    assert events.drain() is None  # events lost: the next sweep looks at everything
    events.close()
    os.close(w)


def test_file_events_on_real_files(tmp_path):
    events = _guard_watch.FileEvents()
    if events.fd is None:
        pytest.skip("no inotify")
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"y" * 10)
    files = g.iter_files([str(tmp_path)])
    events.watch(files)
    assert events.watched == 2
    (tmp_path / "b").read_bytes()
    key_b = next((dev, ino) for path, _unused, dev, ino in files if path.endswith("b"))
    assert events.drain() == {key_b}
    events.close()


# --------------------------------------------------------------------------
# stop conditions


def _proc_stat(proc, pid, comm, state, start):
    fields = [state] + ["0"] * 18 + [str(start)] + ["0"] * 20
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text("%d (%s) %s\n" % (pid, comm, " ".join(fields)))


@pytest.mark.parametrize("comm", ["python3", "vllm serve (x)", "a) b", ""])
def test_proc_start_time_parses_odd_command_names(tmp_path, comm):
    _proc_stat(tmp_path, 42, comm, "S", 12345)
    assert g.proc_start_time(42, str(tmp_path)) == (12345, "S")
    assert g.proc_start_time(43, str(tmp_path)) is None


@pytest.mark.parametrize(
    "change, exited",
    [
        (None, False),
        ("remove", True),
        ("zombie", True),
        ("reused", True),  # same PID, another process
    ],
)
def test_pid_watch(tmp_path, change, exited):
    _proc_stat(tmp_path, 42, "loader", "R", 100)
    watch = _guard_watch.PidWatch(42, str(tmp_path))
    assert watch.exited() is False
    if change == "remove":
        (tmp_path / "42" / "stat").unlink()
    elif change == "zombie":
        _proc_stat(tmp_path, 42, "loader", "Z", 100)
    elif change == "reused":
        _proc_stat(tmp_path, 42, "other", "S", 200)
    assert watch.exited() is exited


def test_pid_watch_of_a_missing_process_has_exited(tmp_path):
    assert _guard_watch.PidWatch(99, str(tmp_path)).exited() is True


def test_pid_watch_with_psutil_on_this_process():
    watch = _guard_watch.PidWatch(os.getpid())
    assert watch.exited() is False


# --------------------------------------------------------------------------
# the guard on a fake /proc


def _fake_proc(tmp_path, cached_mib=1000, mapped_mib=100, available_mib=20000):
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "vm" / "drop_caches").write_text("")
    _set_meminfo(proc, cached_mib, mapped_mib, available_mib)
    return proc


def _set_meminfo(proc, cached_mib, mapped_mib=100, available_mib=20000, free_kb=10000000):
    (proc / "meminfo").write_text(
        "MemTotal: 24000000 kB\nMemFree: %d kB\nMemAvailable: %d kB\nCached: %d kB\n"
        "Mapped: %d kB\nAnonPages: 1 kB\nDirty: 0 kB\n"
        % (free_kb, available_mib * 1024, cached_mib * 1024, mapped_mib * 1024)
    )


def _config(proc, tmp_path, *argv):
    return g.parse_config(
        ["--name", "t", "--proc-root", str(proc), "--status-file", str(tmp_path / "status.json"), *argv]
    )


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_global_mode_writes_the_drop_level_every_tick(tmp_path):
    proc = _fake_proc(tmp_path)
    clock = Clock()
    guard = g.Guard(_config(proc, tmp_path, "--mode", "global", "--drop-level", "3"), clock)
    guard.preflight()
    for _unused in range(3):
        clock.now += 0.1
        assert guard.tick() == 0.1
    assert (proc / "sys" / "vm" / "drop_caches").read_text() == "3\n"
    assert guard.evictions == 3 and guard.ticks == 3


def test_adaptive_without_paths_drops_only_past_the_threshold(tmp_path):
    proc = _fake_proc(tmp_path, cached_mib=1000, mapped_mib=100)
    drop = proc / "sys" / "vm" / "drop_caches"
    clock = Clock()
    guard = g.Guard(_config(proc, tmp_path, "--mode", "adaptive", "--threshold-mib", "32"), clock)
    guard.preflight()
    steps = [
        (1010, 100, False),
        (1500, 600, False),  # the growth is mapped (an mmap loader): nothing to drop
        (1531, 600, False),
        (1533, 600, True),  # unmapped grew 33 MiB above the reference of 900
    ]
    for cached, mapped, dropped in steps:
        _set_meminfo(proc, cached, mapped)
        clock.now += 0.1
        drop.write_text("")
        guard.tick()
        assert (drop.read_text() == "1\n") is dropped, (cached, mapped)
    assert guard.triggers == {"growth": 1}
    status = guard.status("running")
    assert status["peak_growth_mib"] == 533.0
    assert status["peak_unmapped_growth_mib"] == 33.0
    assert status["peak_mapped_mib"] == 600.0


def test_adaptive_leaves_growth_alone_while_memfree_is_above_act_below_free(tmp_path):
    proc = _fake_proc(tmp_path, cached_mib=1000, mapped_mib=0)
    drop = proc / "sys" / "vm" / "drop_caches"
    clock = Clock()
    config = _config(proc, tmp_path, "--mode", "adaptive", "--threshold-mib", "16", "--act-below-free-mib", "4000")
    assert config["act_below_free_mib"] == 4000
    guard = g.Guard(config, clock)
    guard.preflight()
    # the cache grows 1000 MiB in 0.1 s with 9000 MiB free: held; it looks again when, at that rate, MemFree
    # would reach the line: 5000 MiB / 10000 MiB/s = 0.5 s, capped at the interval
    _set_meminfo(proc, 2000, 0, free_kb=9000 * 1024)
    clock.now += 0.1
    drop.write_text("")
    assert guard.tick() == pytest.approx(0.1)
    assert drop.read_text() == "" and guard.policy.held
    # 4100 MiB free, still growing at 10 GiB/s: 100 MiB of headroom -> 0.01 s
    _set_meminfo(proc, 3000, 0, free_kb=4100 * 1024)
    clock.now += 0.1
    assert guard.tick() == pytest.approx(0.01)
    assert drop.read_text() == ""
    # below the line: the first tick drops, for all the growth held so far
    _set_meminfo(proc, 3010, 0, free_kb=3990 * 1024)
    clock.now += 0.1
    guard.tick()
    assert drop.read_text() == "1\n" and not guard.policy.held
    status = guard.status("running")
    assert status["held_ticks"] == 2 and status["triggers"] == {"growth": 1}
    assert status["config"]["act_below_free_mib"] == 4000


@pytest.mark.parametrize("value", ["-1", "1048577", "1.5", "lots", "\uff11"])
def test_act_below_free_mib_bad_values_name_the_option(value, capsys):
    with pytest.raises(SystemExit) as exc:
        g.parse_config(["--name", "t", "--act-below-free-mib", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--act-below-free-mib" in err and "Traceback" not in err


def test_adaptive_polls_faster_while_the_cache_grows(tmp_path):
    proc = _fake_proc(tmp_path, cached_mib=1000, mapped_mib=0)
    clock = Clock()
    guard = g.Guard(_config(proc, tmp_path, "--mode", "adaptive", "--threshold-mib", "32"), clock)
    guard.preflight()
    clock.now += 0.1
    assert guard.tick() == 0.1  # idle
    _set_meminfo(proc, 1024, 0)  # 24 MiB in 0.1 s: 240 MiB/s, 8 MiB headroom -> 1/30 s
    clock.now += 0.1
    assert guard.tick() == pytest.approx(1 / 30.0)


def test_status_has_the_contract_keys(tmp_path):
    proc = _fake_proc(tmp_path)
    guard = g.Guard(_config(proc, tmp_path, "--mode", "global"), Clock())
    status = guard.status("running")
    for key in KEYS:
        assert key in status, key
    assert status["state"] == "running" and status["stop_reason"] is None
    json.dumps(status)


def test_status_says_where_the_cpu_went(tmp_path):
    proc = _fake_proc(tmp_path)
    guard = g.Guard(_config(proc, tmp_path, "--mode", "global"), Clock())
    sum(i * i for i in range(300000))  # some user time of this process (the guard's, here)
    status = guard.status("running")
    assert status["cpu_user_s"] > 0 and status["cpu_sys_s"] >= 0
    # the split adds up to the total (each rounded to the millisecond, read a moment apart)
    assert status["cpu_user_s"] + status["cpu_sys_s"] == pytest.approx(status["cpu_seconds"], abs=0.05)
    assert isinstance(status["major_faults"], int) and status["minor_faults"] > 0


def test_run_stops_at_max_duration_and_writes_status(tmp_path):
    proc = _fake_proc(tmp_path)
    samples = tmp_path / "samples.jsonl"
    cfg = _config(
        proc,
        tmp_path,
        "--mode",
        "global",
        "--interval",
        "0.01",
        "--max-duration",
        "0.2",
        "--samples-file",
        str(samples),
    )
    assert g.run(cfg) == 0
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["stop_reason"] == "max_duration"
    assert status["state"] == "stopped" and status["stopped_at"]
    assert 0.2 <= status["elapsed_s"] < 2
    assert status["ticks"] >= 2
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(lines) == status["ticks"] * 2  # global mode samples before and after each drop
    assert set(lines[0]) == {"t", "MemAvailable", "Cached", "Mapped", "AnonPages", "Dirty"}


def test_run_stops_on_request_at_once_even_with_a_long_interval(tmp_path):
    proc = _fake_proc(tmp_path)
    stop = g.Stopper()
    cfg = _config(proc, tmp_path, "--mode", "global", "--interval", "60", "--max-duration", "100")
    threading.Timer(0.3, stop.set).start()
    assert g.run(cfg, stop) == 0
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["stop_reason"] == "signal"
    assert status["elapsed_s"] < 5
    stop.close()


def test_run_stops_when_the_pid_is_gone(tmp_path):
    proc = _fake_proc(tmp_path)
    _proc_stat(proc, 4242, "loader", "S", 7)
    cfg = _config(proc, tmp_path, "--mode", "global", "--interval", "0.02", "--until-pid", "4242")
    threading.Timer(0.3, (proc / "4242" / "stat").unlink).start()
    assert g.run(cfg) == 0
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["stop_reason"] == "until_pid"
    assert 0.3 <= status["elapsed_s"] < 5


def test_run_error_stop_when_drop_caches_is_not_writable(tmp_path):
    proc = _fake_proc(tmp_path)
    (proc / "sys" / "vm" / "drop_caches").unlink()
    (proc / "sys" / "vm" / "drop_caches").mkdir()  # not a writable file, even for root
    cfg = _config(proc, tmp_path, "--mode", "global", "--max-duration", "1")
    assert g.run(cfg) == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["stop_reason"].startswith("error: ")
    assert status["state"] == "stopped"


def test_run_error_stop_without_meminfo(tmp_path):
    proc = _fake_proc(tmp_path)
    (proc / "meminfo").unlink()
    cfg = _config(proc, tmp_path, "--mode", "global", "--max-duration", "1")
    assert g.run(cfg) == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["stop_reason"].startswith("error: cannot read memory figures")


def test_lock_memory_is_off_unless_asked_and_says_what_it_locked(tmp_path, monkeypatch):
    assert "lock_memory" not in g.parse_config(["--name", "x", "--mode", "global"])
    cfg = g.parse_config(["--name", "x", "--mode", "global", "--lock-memory"])
    assert cfg["lock_memory"] is True
    proc = _fake_proc(tmp_path)
    guard = g.Guard(dict(_config(proc, tmp_path, "--mode", "global"), lock_memory=True), Clock())
    guard.locked_kib, guard.lock_error = 2048, None
    status = guard.status("running")
    assert status["locked_kib"] == 2048 and status["lock_error"] is None
    assert "locked_kib" not in g.Guard(_config(proc, tmp_path, "--mode", "global"), Clock()).status("running")


def test_lock_own_memory_reports_vmlck_or_why_not(tmp_path):
    fake = tmp_path / "status"
    fake.write_text("Name:\tpython3\nVmLck:\t    3072 kB\n")
    locked, error = _guard_memory.lock_own_memory(str(fake))
    if error is None:  # root with CAP_IPC_LOCK (or a large RLIMIT_MEMLOCK): locked, VmLck read
        assert locked == 3072
        import ctypes

        assert ctypes.CDLL(None, use_errno=True).munlockall() == 0  # the test process is not left locked
    else:  # refused: the reason names what is missing, nothing is claimed locked
        assert locked is None and "mlockall" in error and "CAP_IPC_LOCK" in error
