"""Pure logic of uma_sysctl: sizing rule, file parsing, boot order, conflicts, plans."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import memavail
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, parse_fingerprint
from ansible_collections.uma.vllm.plugins.module_utils.system import sysctl as s

GIB = 1024**3


@pytest.mark.parametrize(
    "ram_gib, expected_kb",
    [
        (24, 720896),  # 0.69 GiB
        (64, 1966080),  # 1.88 GiB
        (119, 3735552),  # 3.56 GiB
        (121, 3801088),  # 3.62 GiB
        (128, 3997696),
        (480, 8388608),  # ceiling 8 GiB
        (8, 262144),  # floor 256 MiB
        (2, 144179),  # below the floor the 10% ceiling wins
    ],
)
def test_sizing_rule_table(ram_gib, expected_kb):
    sizing = s.size_min_free_kbytes(ram_gib * GIB)
    assert sizing["min_free_kbytes"] == expected_kb
    assert sizing["rule"] == "uma-3pct-v1"
    # the rule's own promises
    assert sizing["min_free_kbytes"] * 1024 < ram_gib * GIB * s.MAX_RESERVE_PERCENT // 100
    assert sizing["min_free_kbytes"] >= min(sizing["kernel_default_kbytes"], sizing["ceiling_kbytes"])


@pytest.mark.parametrize("ram_gib", [119, 120, 121])
def test_sizing_matches_the_published_range(ram_gib):
    kb = s.size_min_free_kbytes(ram_gib * GIB)["min_free_kbytes"]
    assert 3 * 1024 * 1024 <= kb <= 5 * 1024 * 1024


@pytest.mark.parametrize(
    "ram_gib, expected",
    [(1, 4096), (16, 16384), (121, 45056), (4096, 262144), (0.0001, 128)],
)
def test_kernel_default(ram_gib, expected):
    assert memavail.kernel_default_min_free_kbytes(int(ram_gib * GIB)) == pytest.approx(expected, rel=0.001)


def test_parse_sysctl_text_later_lines_win_and_syntax_variants():
    text = "# c\n; c\nvm.dirty_ratio=10\n-vm/swappiness = 5\n vm.dirty_ratio = 20 \nnot a setting\nvm.x =  1   2 \n"
    assert s.parse_sysctl_text(text) == {"vm.dirty_ratio": "20", "vm.swappiness": "5", "vm.x": "1 2"}


def _tree(tmp_path, ram_kb=126877696, live=None):
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       %d kB\nMemFree:        1000 kB\n" % ram_kb)
    values = {
        "min_free_kbytes": "45056",
        "vfs_cache_pressure": "100",
        "dirty_ratio": "20",
        "dirty_background_ratio": "10",
        "swappiness": "60",
        "lowmem_reserve_ratio": "256\t256\t32\t0\t0",
    }
    values.update(live or {})
    for key, value in values.items():
        (proc / "sys" / "vm" / key).write_text(value + "\n")
    dirs = [tmp_path / d for d in ("etc/sysctl.d", "run/sysctl.d", "usr/lib/sysctl.d")]
    for d in dirs:
        d.mkdir(parents=True)
    return s.SysctlRequest(
        path=str(dirs[0] / "90-vllm.conf"),
        proc_root=str(proc),
        sysctl_dirs=[str(d) for d in dirs],
        sysctl_conf=str(tmp_path / "etc" / "sysctl.conf"),
        state_dir=str(tmp_path / "state"),
    )


def _live(req, key):
    return (open(os.path.join(req.proc_root, "sys", *key.split("."))).read()).strip()


def test_plan_sizes_from_memtotal_and_changes_everything(tmp_path):
    req = _tree(tmp_path)
    p = s.plan(req)
    assert p.sizing["ram_source"] == "MemTotal" and p.sizing["rule"] == "uma-3pct-v1"
    assert p.values["vm.min_free_kbytes"] == str(s.size_min_free_kbytes(126877696 * 1024)["min_free_kbytes"])
    assert p.changed and p.file_changed and p.drift["file"] == "missing"
    assert set(p.drift["live"]) == set(s.MANAGED_KEYS)
    assert not os.path.exists(req.path), "plan() must not touch anything"


def test_execute_then_replan_is_unchanged_and_records_originals(tmp_path):
    req = _tree(tmp_path)
    s.execute(s.plan(req), req.proc_root)
    assert _live(req, "vm.vfs_cache_pressure") == "200"
    text = open(req.path).read()
    assert parse_fingerprint(text)["intact"]
    again = s.plan(req)
    assert not again.changed and again.drift == {"file": None, "live": {}}
    record = json.load(open(os.path.join(req.state_dir, s.RECORD_NAME)))
    assert record == {
        "vm.min_free_kbytes": "45056",
        "vm.vfs_cache_pressure": "100",
        "vm.dirty_ratio": "20",
        "vm.dirty_background_ratio": "10",
    }


def test_drift_in_file_and_live_is_reported_and_corrected(tmp_path):
    req = _tree(tmp_path)
    s.execute(s.plan(req), req.proc_root)
    with open(req.path, "a") as handle:
        handle.write("vm.dirty_ratio = 40\n")
    open(os.path.join(req.proc_root, "sys", "vm", "dirty_ratio"), "w").write("30\n")
    p = s.plan(req)
    assert p.drift["file"] == "edited by hand (fingerprint mismatch)"
    assert p.drift["live"] == {"vm.dirty_ratio": {"expected": "5", "actual": "30"}}
    s.execute(p, req.proc_root)
    assert _live(req, "vm.dirty_ratio") == "5"
    # the recorded original stays the operator's first value, not the drifted one
    record = json.load(open(os.path.join(req.state_dir, s.RECORD_NAME)))
    assert record["vm.dirty_ratio"] == "20"
    assert not s.plan(req).changed


def test_absent_restores_the_recorded_values_and_removes_everything(tmp_path):
    req = _tree(tmp_path)
    req.extra = {"vm.swappiness": 10}
    s.execute(s.plan(req), req.proc_root)
    assert _live(req, "vm.swappiness") == "10"
    req.state = "absent"
    p = s.plan(req)
    assert p.changed and p.file_after is None
    s.execute(p, req.proc_root)
    assert not os.path.exists(req.path)
    assert not os.path.exists(os.path.join(req.state_dir, s.RECORD_NAME))
    for key, value in {"min_free_kbytes": "45056", "dirty_ratio": "20", "swappiness": "60"}.items():
        assert _live(req, "vm." + key) == value
    assert not s.plan(req).changed


def test_apply_false_writes_only_the_file(tmp_path):
    req = _tree(tmp_path)
    req.apply = False
    p = s.plan(req)
    s.execute(p, req.proc_root)
    assert os.path.exists(req.path)
    assert _live(req, "vm.dirty_ratio") == "20"
    assert not os.path.exists(os.path.join(req.state_dir, s.RECORD_NAME))
    assert not s.plan(req).changed


def test_multi_value_extra_keys_compare_normalised(tmp_path):
    req = _tree(tmp_path)
    req.extra = {"vm.lowmem_reserve_ratio": "256 256 32 0 0"}
    p = s.plan(req)
    assert "vm.lowmem_reserve_ratio" not in p.drift["live"]


@pytest.mark.parametrize(
    "files, wins",
    [
        ({"etc/sysctl.d/99-local.conf": "vm.dirty_ratio = 20\n"}, {("99-local.conf", "vm.dirty_ratio"): True}),
        ({"etc/sysctl.d/10-early.conf": "vm.dirty_ratio = 20\n"}, {("10-early.conf", "vm.dirty_ratio"): False}),
        # later name in a lower-priority directory still sorts after ours
        (
            {"usr/lib/sysctl.d/95-vendor.conf": "vm.min_free_kbytes=1\n"},
            {("95-vendor.conf", "vm.min_free_kbytes"): True},
        ),
        # same name in a lower-priority dir is masked by ours
        ({"usr/lib/sysctl.d/90-vllm.conf": "vm.dirty_ratio=9\n"}, {("90-vllm.conf", "vm.dirty_ratio"): False}),
        ({"etc/sysctl.conf": "vm.vfs_cache_pressure=50\n"}, {("sysctl.conf", "vm.vfs_cache_pressure"): True}),
        ({"etc/sysctl.d/99-other.conf": "net.core.somaxconn = 1\n"}, {}),
    ],
)
def test_conflicts_follow_systemd_sysctl_ordering(tmp_path, files, wins):
    req = _tree(tmp_path)
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    found = {(os.path.basename(c["path"]), c["key"]): c["wins_at_boot"] for c in s.plan(req).conflicts}
    assert found == wins


def test_same_name_in_earlier_directory_masks_ours(tmp_path):
    req = _tree(tmp_path)
    ours = tmp_path / "usr/lib/sysctl.d/90-vllm.conf"
    req.path = str(ours)
    (tmp_path / "etc/sysctl.d/90-vllm.conf").write_text("# local override\n")
    conflicts = s.plan(req).conflicts
    assert conflicts and all(c["wins_at_boot"] for c in conflicts)
    assert {c["key"] for c in conflicts} == set(s.MANAGED_KEYS)


def test_sysctl_conf_linked_from_sysctl_d_is_counted_once(tmp_path):
    req = _tree(tmp_path)
    conf = tmp_path / "etc" / "sysctl.conf"
    conf.write_text("vm.dirty_ratio = 20\n")
    os.symlink(str(conf), str(tmp_path / "etc/sysctl.d/99-sysctl.conf"))
    conflicts = s.plan(req).conflicts
    assert [(os.path.basename(c["path"]), c["wins_at_boot"]) for c in conflicts] == [("99-sysctl.conf", True)]


def test_bounds_follow_ram_gib_not_memtotal(tmp_path):
    req = _tree(tmp_path, ram_kb=24 * 1024 * 1024)
    req.min_free_kbytes = 5242880  # 5 GiB: too much for 24 GiB, fine for 119 GiB
    with pytest.raises(UmaError, match="above 10% of RAM"):
        s.plan(req)
    req.ram_gib = 119
    assert s.plan(req).values["vm.min_free_kbytes"] == "5242880"


def test_file_for_another_host_is_not_bounded_by_this_hosts_ram(tmp_path):
    req = _tree(tmp_path, ram_kb=24 * 1024 * 1024)
    req.path = str(tmp_path / "render" / "x.conf")
    req.apply = False
    req.min_free_kbytes = 3145728
    p = s.plan(req)
    assert p.values["vm.min_free_kbytes"] == "3145728" and p.sizing["bounds_checked"] is False


def test_missing_meminfo_without_ram_gib_is_a_clear_error(tmp_path):
    req = _tree(tmp_path)
    os.unlink(os.path.join(req.proc_root, "meminfo"))
    with pytest.raises(UmaError) as err:
        s.plan(req)
    assert "ram_gib" in err.value.message and "Set ram_gib" in err.value.message


@pytest.mark.parametrize(
    "damage, problem",
    [
        (b'{"vm.min_free_kbytes": "45056", "vm.dirty_r', "not JSON (truncated?)"),
        (b'{"vm.min_free_kbytes": "45\xff\xfe"}', "not UTF-8 text"),
        (b"", "empty"),
        (b'["vm.min_free_kbytes", "45056"]', "not a JSON object"),
        (b'{"vm.min_free_kbytes": null}', "are not vm.* names with a number as value"),
        (b'{"vm.min_free_kbytes": true}', "are not vm.* names with a number as value"),
        (b'{"kernel.panic": "1"}', "are not vm.* names with a number as value"),
    ],
)
@pytest.mark.parametrize("state", ["absent", "present"])
def test_a_damaged_record_of_the_originals_is_refused_never_taken_for_none(tmp_path, damage, problem, state):
    """Issue 36: a truncated or non-UTF-8 sysctl-original.json was read as "no record": state=absent
    deleted the drop-in and restored nothing (the operator's values gone, changed, no warning), and
    state=present recorded the collection's own values as the originals. Now: refused, naming the
    file and the keys whose originals it must hold; nothing on the node changes."""
    req = _tree(tmp_path)
    s.execute(s.plan(req), req.proc_root)
    record = os.path.join(req.state_dir, s.RECORD_NAME)
    with open(record, "wb") as handle:
        handle.write(damage)
    before = {p: open(p, "rb").read() for p in (req.path, record)}
    live = {key: _live(req, key) for key in s.MANAGED_KEYS}
    req.state = state
    with pytest.raises(UmaError) as err:
        s.plan(req)
    assert err.value.option == "state_dir" and record in err.value.problem and problem in err.value.problem
    assert "nothing was changed" in err.value.problem
    assert '"vm.min_free_kbytes": "<original>"' in err.value.fix and '"vm.dirty_ratio": "<original>"' in err.value.fix
    assert {p: open(p, "rb").read() for p in (req.path, record)} == before
    assert {key: _live(req, key) for key in s.MANAGED_KEYS} == live


def test_a_whole_record_with_number_values_still_restores(tmp_path):
    """The record as older versions wrote it (numbers, not text) is a record: absent restores from it."""
    req = _tree(tmp_path)
    s.execute(s.plan(req), req.proc_root)
    record = os.path.join(req.state_dir, s.RECORD_NAME)
    with open(record, "w", encoding="utf-8") as handle:
        json.dump({"vm.min_free_kbytes": 45056, "vm.dirty_ratio": 20}, handle)
    req.state = "absent"
    s.execute(s.plan(req), req.proc_root)
    assert _live(req, "vm.min_free_kbytes") == "45056" and _live(req, "vm.dirty_ratio") == "20"
