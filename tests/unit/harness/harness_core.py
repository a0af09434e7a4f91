"""Core of the bad-input harness: run a module in-process, classify the outcome.

``drive(module, args, root, names)`` runs ``module.main()`` with the arguments
as Ansible would pass them, with the working directory inside ``root`` (so a
relative path cannot escape), and classifies what happened:

- ``ok``: exit_json, a result that serialises as strict JSON (no NaN/inf)
- ``refused``: fail_json whose message names one of ``names`` (the options
  that were made bad, or the option whose file was damaged)
- ``unclear``: fail_json whose message names none of them
- ``traceback``: any other exception escaped ``main()`` (what Ansible shows as
  MODULE FAILURE)
- ``partial``: fail_json, but some byte under ``root`` changed

Every byte, mode and symlink target under ``root`` is snapshotted before the
run and compared after a failure.
"""

from __future__ import annotations

import json
import math
import os
import stat
import traceback
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Dict, Iterable, List, Optional, Tuple
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

COUNTS: Dict[str, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
EXAMPLES: Dict[str, List[str]] = defaultdict(list)

INJECT = "Injected=1"
LAST_RESULT: Dict[str, Any] = {}


def _scratch() -> Tuple[Optional[str], str]:
    """Where the harness makes its cases' trees (thousands of small files each made, snapshotted and
    removed per case): /dev/shm where it is a writable tmpfs with 2 GiB free, else the system's temp
    directory (UMA_HARNESS_TMP names another). On the build VM's disk these file operations were most
    of the time (rdma_facts: 39.5 s on /tmp, 13.0 s on /dev/shm; 109 s in a CI run beside the lab's
    build, which writes to the same disk). The modules under test read and write what they would on a
    disk: none of them depends on the file system's kind (the whole unit suite passed its harness
    files with TMPDIR=/dev/shm)."""
    named = os.environ.get("UMA_HARNESS_TMP")
    if named:
        return named, "UMA_HARNESS_TMP"
    shm = "/dev/shm"
    try:
        fs = os.statvfs(shm)
        with open("/proc/self/mounts", encoding="utf-8") as handle:
            tmpfs = any(f[1] == shm and f[2] == "tmpfs" for f in (line.split() for line in handle) if len(f) > 2)
    except OSError:
        return None, "no /dev/shm"
    if tmpfs and os.access(shm, os.W_OK) and fs.f_bavail * fs.f_frsize >= 2 << 30:
        return shm, "tmpfs, %.0f GiB free" % (fs.f_bavail * fs.f_frsize / 2**30)
    return None, "/dev/shm is not a writable tmpfs with 2 GiB free"


SCRATCH, SCRATCH_WHY = _scratch()


class _Exit(Exception):
    def __init__(self, failed: bool, result: Dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.failed = failed
        self.result = result


def _exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise _Exit(False, kwargs)


def _fail_json(self, msg, **kwargs):
    kwargs["msg"] = msg
    kwargs["failed"] = True
    raise _Exit(True, kwargs)


@contextmanager
def patched(runner=None, extra: Iterable[Tuple[Any, str, Any]] = ()):
    """exit_json/fail_json raise; run_command goes to ``runner`` (a fake systemd) when given."""
    patches = [
        mock.patch.object(basic.AnsibleModule, "exit_json", _exit_json),
        mock.patch.object(basic.AnsibleModule, "fail_json", _fail_json),
    ]
    if runner is not None:
        patches.append(mock.patch.object(basic.AnsibleModule, "run_command", lambda self, args, **kw: runner(args)))
        patches.append(
            mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **kw: "/usr/bin/" + name)
        )
    for target, attr, value in extra:
        patches.append(mock.patch.object(target, attr, value))
    for p in patches:
        p.start()
    try:
        yield
    finally:
        for p in reversed(patches):
            p.stop()


def snapshot(root: str) -> Dict[str, Tuple]:
    """Every entry under root: type, mode, bytes or link target."""
    out: Dict[str, Tuple] = {}
    for base, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            full = os.path.join(base, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as handle:
                    out[rel] = ("file", stat.S_IMODE(st.st_mode), handle.read())
            else:
                out[rel] = ("other", st.st_mode)
    return out


def _strict_json(result: Dict[str, Any]) -> Optional[str]:
    try:
        json.dumps(result, allow_nan=False, default=str)
    except ValueError as err:
        return "result is not strict JSON: %s" % err
    return None


def _injected(root: str) -> Optional[str]:
    """A written file that carries the injected line on a line of its own."""
    for base, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            full = os.path.join(base, name)
            if os.path.islink(full):
                continue
            try:
                with open(full, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            for line in data.splitlines():
                if line.strip().startswith(INJECT.encode()):
                    return full
    return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 300 else text[:300] + "..."


def drive(
    target: str,
    module: Any,
    args: Dict[str, Any],
    root: str,
    names: Iterable[str],
    nonsense: bool = False,
    check_mode: bool = False,
) -> str:
    """Run one case; count and return its outcome (see the module docstring).

    ``nonsense`` marks a case whose input no sane module accepts (a bool or
    NaN for a number, ...): success then counts as ``nonsense``.
    """
    names = [n for n in names if n]
    before = snapshot(root)
    full = dict(args)
    full["_ansible_check_mode"] = check_mode
    full["_ansible_diff"] = True
    full.setdefault("_ansible_remote_tmp", root)
    LAST_RESULT.clear()
    cwd = os.getcwd()
    os.chdir(root)
    outcome, detail = None, ""
    try:
        with patch_module_args(full):
            module.main()
        outcome, detail = "traceback", "main() returned without exit_json/fail_json"
    except _Exit as done:
        LAST_RESULT["result"] = done.result
        if done.failed:
            msg = str(done.result.get("msg", ""))
            if snapshot(root) != before:
                outcome, detail = "partial", "failed but changed files: %s" % msg
            elif not names or any(n in msg for n in names):
                outcome = "refused"
            else:
                outcome, detail = "unclear", "message names none of %s: %s" % (names, msg)
        else:
            problem = _strict_json(done.result)
            hit = _injected(root)
            if problem:
                outcome, detail = "nonsense", problem
            elif hit:
                outcome, detail = "nonsense", "injected line written to %s" % hit
            elif nonsense:
                outcome, detail = "nonsense", "accepted"
            else:
                outcome = "ok"
    except SystemExit as exc:
        outcome, detail = "traceback", "SystemExit %s" % exc
    except BaseException:
        outcome, detail = "traceback", traceback.format_exc(limit=-3)
    finally:
        os.chdir(cwd)
    counts = COUNTS[target]
    counts["cases"] += 1
    counts[outcome] += 1
    if outcome not in ("ok", "refused") and len(EXAMPLES[target]) < 40:
        shown = {k: v for k, v in args.items() if k in names or k.startswith("_")}
        EXAMPLES[target].append("%s: %s <- %s\n    %s" % (outcome, names, _show(shown), detail.strip()[-600:]))
    return outcome


def report(target: str, minimum: int = 1000) -> None:
    """Fail the calling test when any case went wrong or too few ran."""
    counts = COUNTS[target]
    bad = {k: counts[k] for k in ("traceback", "partial", "unclear", "nonsense") if counts[k]}
    assert counts["cases"] >= minimum, "only %d cases for %s" % (counts["cases"], target)
    assert not bad, "%s: %s\n%s" % (target, bad, "\n".join(EXAMPLES[target]))


# Values no module should accept for a number (or treat as anything but refusable).
NUMERIC_NONSENSE = [
    True,
    False,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e308,
    -1e308,
    10**40,
    -(10**40),
    "nan",
    "inf",
    "1e999",
    "\u00b2",
    "--5",
    "\u0663",
    "",
    [],
    {},
    [1],
    {"a": 1},
    "x",
]

GENERIC = [
    *NUMERIC_NONSENSE,
    None,
    0,
    -1,
    -5,
    1,
    2**31,
    2**63,
    1.5,
    "0",
    "-0",
    "1.5",
    " ",
    "a\n%s" % INJECT,
    "x\x00y",
    "a;b",
    '"',
    "'",
    "$(id)",
    "%n",
    "éè",
    "x" * 300,
    "../../x",
    "a b",
    "--flag=1",
    "\\",
]


def is_bad_number(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, float) and (not math.isfinite(value) or abs(value) >= 1e300):
        return True
    if isinstance(value, int) and abs(value) >= 10**30:
        return True
    return any(value is v for v in NUMERIC_NONSENSE) or (isinstance(value, str) and value in NUMERIC_NONSENSE)


def make_paths(base: str) -> Dict[str, str]:
    """Awkward filesystem objects under base: returns {label: path}."""
    os.makedirs(base, exist_ok=True)
    paths = {}

    def p(label):
        paths[label] = os.path.join(base, label)
        return paths[label]

    with open(p("a_file"), "w") as handle:
        handle.write("plain text\n")
    os.mkdir(p("a_dir"))
    os.symlink(os.path.join(base, "nowhere"), p("dangling"))
    os.symlink(os.path.join(base, "loop_b"), p("loop_a"))
    os.symlink(os.path.join(base, "loop_a"), os.path.join(base, "loop_b"))
    with open(p("non_utf8"), "wb") as handle:
        handle.write(b"\xff\xfe\x80abc\x00\n")
    paths["under_a_file"] = os.path.join(paths["a_file"], "child")
    paths["dir_symlink"] = os.path.join(base, "dir_symlink")
    os.symlink(paths["a_dir"], paths["dir_symlink"])
    paths["relative"] = "relative/path"
    paths["empty"] = ""
    return paths


def damage(path: str, how: str) -> None:
    """Replace the file or directory at path by something awkward."""
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            import shutil

            shutil.rmtree(path)
        else:
            os.unlink(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    if how == "dir":
        os.mkdir(path)
    elif how == "dangling":
        os.symlink(path + ".nowhere", path)
    elif how == "loop":
        os.symlink(path + ".loop", path)
        os.symlink(path, path + ".loop")
    elif how == "non_utf8":
        with open(path, "wb") as handle:
            handle.write(b"\xff\xfe\x80 = \xc3\x28\n")
    elif how == "binary":
        with open(path, "wb") as handle:
            handle.write(bytes(range(256)))
    elif how == "json_list":
        with open(path, "w") as handle:
            handle.write("[1, 2, 3]\n")
    elif how == "json_scalar":
        with open(path, "w") as handle:
            handle.write('"text"\n')
    elif how == "empty":
        open(path, "w").close()
    elif how == "missing":
        pass
    else:
        raise ValueError(how)


DAMAGE = ["dir", "dangling", "loop", "non_utf8", "binary", "json_list", "json_scalar", "empty", "missing"]
