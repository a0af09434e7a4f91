# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad-input harness, node side, for the records the node programs read back (issue 36 item 4):
a readahead window's record, which holds the devices' original ``read_ahead_kb`` values, as the
real restorer reads it (``python3 -E -s uma_readahead.py restore --record FILE``: what the
window's timer and the boot unit run), on a stand-in sysfs tree (sda, sdb at the window's 8 KB).

Each case starts from the record the window writes (``blockdev.new_record``: sda's original
4096, sdb's 256) and makes it bad in one way (fixed seed): the file damaged as in
test_harness_node.py (empty, truncated, another JSON kind, not UTF-8, a directory, a FIFO, a
symlink, a loop, nested too deep), or one field given a bad value (an original that is text,
true, negative, a float, too large, NaN; a device name or number that is not one; the device
list not a list; an entry not an object; a top-level number that is not one).

A bad case passes ("refused") when the restorer exits 1 with a result whose errors name the
record file (and the field, for a field case), the record is still there, and no device holds a
value the record did not give it (a damaged entry's device keeps 8; an intact entry beside it
may be restored). Counted: ``traceback``, ``hang`` (timeout: e.g. a FIFO opened for reading),
``silent`` (exit 0 on a damaged record, the record deleted, or a device written with a value
that is not its original), ``unclear`` (another exit, no error naming the file or field),
``false_refusal`` (a valid variant refused). conftest prints the counts beside the programs'.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import harness_core as h
from hypothesis import given, settings
from hypothesis import strategies as st
from test_harness_node import EXAMPLES as PROGRAM_EXAMPLES
from test_harness_node import (
    FILE_DAMAGE,
    NUMERIC_BAD,
    PYTHON,
    RAW,
    SETTINGS,
    TEXT_BAD,
    TIMEOUT_S,
    _dump,
    _rmtree,
    damage_file,
    tally,
)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "module_utils"))
import node_helpers

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev

TARGET = "node:readahead record"
EXAMPLES = max(60, PROGRAM_EXAMPLES // 2)
WINDOW_KB = 8
ORIGINALS = {"sda": 4096, "sdb": 256}
DEVS = {"sda": "8:0", "sdb": "8:16"}
# the file damages that make a record unreadable (missing: no record, a no-op; huge and unknown_key:
# still a valid record; nan_literal: drawn as a field value below)
FILE_BAD = [how for how in FILE_DAMAGE if how not in ("missing", "huge", "unknown_key", "nan_literal")]
FIELDS = {
    "original_kb": [*NUMERIC_BAD, 4294967296, 1024.0, None],
    "device": [*TEXT_BAD, "../sda", "sda/../../x", None],
    "dev": ["8", "8:", ":0", "a:b", "8:0:1", 8, True, [], None, "8:0\n"],
}
TOP_NUMBERS = ("version", "read_ahead_kb", "duration", "opened_at", "ends_at")


@dataclass
class Case:
    argv: List[str]
    root: str
    record: str
    names: List[str]  # the errors must name each of these
    damaged: Optional[str] = None  # the device whose entry is damaged (it must keep WINDOW_KB)
    bad: bool = True
    label: str = ""
    before: Optional[bytes] = None  # the record's bytes (a damaged record stays as it was)


def _sysfs(root: str) -> str:
    sys_root = os.path.join(root, "sys")
    for name, dev in DEVS.items():
        path = os.path.join(sys_root, "devices", "virtual", "block", name)
        os.makedirs(os.path.join(path, "queue"))
        with open(os.path.join(path, "dev"), "w", encoding="ascii") as handle:
            handle.write(dev + "\n")
        with open(os.path.join(path, "queue", "read_ahead_kb"), "w", encoding="ascii") as handle:
            handle.write("%d\n" % WINDOW_KB)
        for link in (os.path.join(sys_root, "class", "block", name), os.path.join(sys_root, "dev", "block", dev)):
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(path, link)
    return sys_root


def _ra(case: Case, name: str) -> int:
    with open(os.path.join(case.root, "sys", "class", "block", name, "queue", "read_ahead_kb"), encoding="ascii") as f:
        return int(f.read())


def build(data, root: str, variant: Optional[str] = None) -> Case:
    sys_root = _sysfs(root)
    devices = [_blockdev.BlockDevice(n, DEVS[n], os.path.join(sys_root, "class", "block", n), "disk") for n in DEVS]
    valid = _blockdev.new_record("w", devices, ORIGINALS, WINDOW_KB, 180, 1_700_000_000.0)
    path = _blockdev.record_path(os.path.join(root, "state"), "w")
    os.makedirs(os.path.dirname(path))
    argv = [os.path.join(node_helpers.NODE_LIB, "uma_readahead.py"), "restore", "--record", path,
            "--sysfs-root", sys_root]  # fmt: skip
    _dump(path, valid)
    mode = data.draw(st.sampled_from(["field", "field", "file", "valid"]), label="mode") if data else "valid"
    if mode == "valid":
        how = variant or data.draw(st.sampled_from(VALID), label="variant")
        if how == "extra key":  # a later version's field: not read, not refused
            _dump(path, dict(valid, comment="x" * 1000))
        elif how == "no dev":  # MAJ:MIN not recorded: restored by name
            _dump(path, dict(valid, devices=[{k: v for k, v in d.items() if k != "dev"} for d in valid["devices"]]))
        elif how == "missing":
            os.unlink(path)
        return Case(argv, root, path, [], bad=False, label="valid: " + how)
    if mode == "file":
        how = data.draw(st.sampled_from(FILE_BAD), label="damage")
        damage_file(path, how, valid, data)
        return Case(argv, root, path, [path], label="record " + how, before=_bytes(path))
    where = data.draw(st.sampled_from(["entry", "entry", "top", "list"]), label="where")
    if where == "top":
        key = data.draw(st.sampled_from(TOP_NUMBERS), label="key")
        value = data.draw(st.sampled_from([v for v in NUMERIC_BAD if not isinstance(v, int) or isinstance(v, bool)]
                                          + [-1]), label="value")  # fmt: skip
        _dump(path, dict(valid, **{key: value}))
        names = [path] if _reader_refuses(value) else [path, key]
        return Case(argv, root, path, names, label="%s=%r" % (key, value), before=_bytes(path), damaged="*")
    if where == "list":
        value = data.draw(st.sampled_from([{"sda": 4096}, "sda", None, 5, True]), label="devices")
        _dump(path, dict(valid, devices=value))
        return Case(argv, root, path, [path, "devices"], label="devices=%r" % (value,), before=_bytes(path),
                    damaged="*")  # fmt: skip
    index = data.draw(st.sampled_from([0, 1]), label="entry")
    entry = dict(valid["devices"][index])
    name = entry["device"]
    key = data.draw(st.sampled_from([*sorted(FIELDS), "not an object"]), label="field")
    entries = [dict(e) for e in valid["devices"]]
    if key == "not an object":
        value = data.draw(st.sampled_from(["junk", 5, None, [name, 4096], True]), label="entry value")
        entries[index] = value
        names = [path, "devices[%d]" % index]
    else:
        value = data.draw(st.sampled_from(FIELDS[key]), label="value")
        entries[index] = dict(entry, **{key: value})
        names = [path] if _reader_refuses(value) else [path, "devices[%d].%s" % (index, key)]
    _dump(path, dict(valid, devices=entries))
    label = "devices[%d].%s=%r" % (index, key, value)
    return Case(argv, root, path, names, label=label, before=_bytes(path), damaged=name)


VALID = ("as is", "extra key", "no dev", "missing")


def _reader_refuses(value: Any) -> bool:
    """Refused by the record reader itself, which names the file but no key: NaN, Infinity and 1e400
    (written as bare literals) and whole numbers beyond 64 bits."""
    if isinstance(value, str):
        return value in RAW
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1 << 63


def _bytes(path: str) -> Optional[bytes]:
    """What is at the record's path: a file's bytes, a symlink's target, or None (never opens a FIFO)."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return os.readlink(path).encode()
        if not stat.S_ISREG(info.st_mode):
            return None
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def run_case(case: Case) -> Dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    try:
        proc = subprocess.run([PYTHON, "-E", "-s", *case.argv], capture_output=True, text=True, errors="replace",
                              timeout=TIMEOUT_S, env=env, cwd=case.root, check=False,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"outcome": "hang", "detail": "no exit within %ss" % TIMEOUT_S}
    return judge(case, proc.returncode, proc.stdout, proc.stderr)


def judge(case: Case, code: int, out: str, err: str) -> Dict[str, Any]:
    detail = "exit %d: %s %s" % (code, out.strip()[-500:], err.strip()[-300:])
    if "Traceback (most recent call last)" in err:
        return {"outcome": "traceback", "detail": detail}
    values = {name: _ra(case, name) for name in DEVS}
    if not case.bad:
        want = {} if case.label == "valid: missing" else ORIGINALS
        if code != 0 or any(values[n] != want.get(n, WINDOW_KB) for n in DEVS) or os.path.lexists(case.record):
            return {"outcome": "false_refusal", "detail": "%s; devices %s" % (detail, values)}
        return {"outcome": "ok", "detail": ""}
    # a device may hold the window's value or its own original; a damaged entry's device keeps the window's
    wrong = {n: v for n, v in values.items() if v not in (WINDOW_KB, ORIGINALS[n]) or
             (case.damaged in (n, "*") and v != WINDOW_KB)}  # fmt: skip
    if wrong or not os.path.lexists(case.record) or (case.before is not None and _bytes(case.record) != case.before):
        return {"outcome": "silent", "detail": "%s; devices %s, record kept: %s" % (
            detail, values, os.path.lexists(case.record))}  # fmt: skip
    if code == 0:
        return {"outcome": "silent", "detail": "exit 0 on a damaged record: " + detail}
    if code != 1:
        return {"outcome": "unclear", "detail": detail}
    try:
        errors = [e for r in json.loads(out)["results"] for e in r["errors"]]
    except (ValueError, KeyError, TypeError):
        return {"outcome": "unclear", "detail": "no result on stdout: " + detail}
    if not any(all(name in e for name in case.names) for e in errors):
        return {"outcome": "unclear", "detail": "no error names all of %s: %s" % (case.names, errors)}
    return {"outcome": "refused", "detail": ""}


def test_readahead_record_damaged_every_way_is_named_and_kept():
    h.COUNTS.pop(TARGET, None)
    h.EXAMPLES.pop(TARGET, None)
    cases: List[Case] = []
    base = tempfile.mkdtemp(prefix="record-harness-", dir=h.SCRATCH)

    @settings(SETTINGS, max_examples=EXAMPLES)
    @given(st.data())
    def generate(data):
        cases.append(build(data, tempfile.mkdtemp(dir=base)))

    try:
        generate()
        cases.extend(build(None, tempfile.mkdtemp(dir=base), how) for how in VALID)
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(run_case, cases))
    finally:
        _rmtree(base)
    counts, bad = tally(TARGET, cases, results, EXAMPLES)
    assert counts["ok"] >= len(VALID), "the valid variants were not all restored (%s)" % dict(counts)
    assert not bad, "%s: %s\n%s" % (TARGET, bad, "\n".join(h.EXAMPLES[TARGET]))


def test_the_harness_judge_catches_what_it_counts():
    """The judge is not a test that cannot fail: a restorer that deleted a damaged record, wrote a
    guessed value or said nothing is counted as what it is."""
    root = tempfile.mkdtemp(prefix="record-judge-", dir=h.SCRATCH)
    try:
        case = build(None, root, "as is")
        case.bad, case.names, case.damaged = True, [case.record, "devices[0].original_kb"], "sda"
        case.before = _bytes(case.record)
        assert judge(case, 0, '{"results": []}', "")["outcome"] == "silent"  # exit 0, nothing said
        said = json.dumps({"results": [{"errors": ["%s has devices[0].original_kb = ..." % case.record]}]})
        assert judge(case, 1, said, "")["outcome"] == "refused"
        assert judge(case, 1, json.dumps({"results": [{"errors": ["damaged"]}]}), "")["outcome"] == "unclear"
        assert judge(case, 1, said, "Traceback (most recent call last):\n")["outcome"] == "traceback"
        with open(os.path.join(root, "sys", "class", "block", "sda", "queue", "read_ahead_kb"), "w") as handle:
            handle.write("4096\n")  # the damaged entry's device written anyway
        assert judge(case, 1, said, "")["outcome"] == "silent"
        os.unlink(case.record)
        assert judge(case, 1, said, "")["outcome"] == "silent"  # the record (the originals) deleted
    finally:
        _rmtree(root)
