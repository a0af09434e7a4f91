# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared helpers for the uma.vllm modules (private to the collection).

Nothing here imports Ansible: the helpers are used by the modules, by the
node-side programs (guard, launcher) and by the unit tests alike.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import secrets
import stat
import sys
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple, Union

_INT_RE = re.compile(r"\s*-?[0-9]+\s*", re.ASCII)

MANAGED_MARKER = "Managed by uma.vllm"


class UmaError(Exception):
    """A refusal with the option, the value and the fix.

    The message always has the form
    ``option '<name>' = <value>: <problem>. <fix>`` so an operator can act on
    it without reading code. Modules turn it into ``fail_json(msg=...)``.
    """

    def __init__(self, option: str, value: Any, problem: str, fix: str) -> None:
        self.option = option
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return "option '%s' = %s: %s. %s" % (self.option, _show(self.value), self.problem, self.fix)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def fingerprint(body: str) -> str:
    """Short content fingerprint used in managed-file headers."""
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def managed_header(what: str, body: str, comment: str = "#") -> str:
    """Header for a file the collection owns.

    It names the owner, what the file is for, and a fingerprint of the body
    below it, so drift inside the body is visible even when the header is kept.
    """
    lines = [
        "%s %s (%s). Local edits are reverted on the next run." % (comment, MANAGED_MARKER, what),
        "%s fingerprint: sha256:%s" % (comment, fingerprint(body)),
    ]
    return "\n".join(lines) + "\n"


def parse_fingerprint(text: str, comment: str = "#") -> Optional[Dict[str, Any]]:
    """Return ``{"recorded": fp, "actual": fp, "intact": bool}`` or None.

    None means the text carries no uma.vllm header.
    """
    lines = text.splitlines(True)
    if len(lines) < 2 or MANAGED_MARKER not in lines[0]:
        return None
    prefix = "%s fingerprint: sha256:" % comment
    if not lines[1].startswith(prefix):
        return None
    recorded = lines[1][len(prefix) :].strip()
    actual = fingerprint("".join(lines[2:]))
    return {"recorded": recorded, "actual": actual, "intact": recorded == actual}


def read_text(path: str) -> Optional[str]:
    """File content, or None when the file does not exist.

    Bytes that are not UTF-8 become U+FFFD instead of an exception: a file
    damaged on the node is drift or evidence, never a traceback. Other OS
    errors (a directory in its place, a symlink loop) propagate as OSError.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def atomic_write(
    path: str, content: Union[str, bytes], mode: int = 0o644, safe: bool = False, durable: bool = True
) -> None:
    """Write ``content`` to ``path`` so that readers see the old or the new file.

    The data goes to an exclusive temporary file (``O_EXCL|O_NOFOLLOW``, a random
    name) in the same directory, gets its mode (``fchmod``), is flushed to disk,
    then renamed over the target, and the directory is flushed. A failure leaves
    the old file intact and no temporary file behind. ``safe``: the directory is
    checked first (:func:`open_safe_dir`), as every write of a node program does
    (:func:`node_write`); a symlink at ``path`` is replaced, never followed.
    ``durable=False`` skips both fsyncs (still atomic).
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    name = os.path.basename(path)
    try:
        os.makedirs(directory, mode=0o755 if safe else 0o777, exist_ok=True)
        dfd = open_safe_dir(directory) if safe else os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _nothing_replaced(exc, path) from exc
    try:
        data = content if isinstance(content, bytes) else content.encode("utf-8")
        _replace_in(dfd, name, data, mode, durable, path)
        if safe and (directory, name) not in _SWEPT:
            _SWEPT.add((directory, name))
            _sweep_stale(dfd, name)
    finally:
        os.close(dfd)


def _replace_in(dfd: int, name: str, data: bytes, mode: int, durable: bool, path: str) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    tmp, fd = "", -1
    for _attempt in range(100):
        tmp = ".%s.%s.tmp" % (name, secrets.token_hex(6))
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise _nothing_replaced(exc, path) from exc
    if fd < 0:
        raise _nothing_replaced(FileExistsError(errno.EEXIST, "no free temporary name", path), path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None:
            raise _nothing_replaced(exc, path) from exc
        raise
    if durable:
        os.fsync(dfd)


_SWEPT: Set[Any] = set()
_TEMP_RE = re.compile(r"\.(.+)\.[0-9a-f]{12}\.tmp")
STALE_TEMP_S = 600


def _sweep_stale(dfd: int, name: str) -> None:
    """Remove this file's temp files that a killed writer (a power loss) left, once per process.

    Only ``.<name>.<12 hex>.tmp`` regular files older than STALE_TEMP_S: no writer holds one that long.
    """
    now = time.time()
    try:
        with os.scandir(dfd) as entries:
            for entry in entries:
                match = _TEMP_RE.fullmatch(entry.name)
                if not match or match.group(1) != name:
                    continue
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and now - info.st_mtime > STALE_TEMP_S:
                    os.unlink(entry.name, dir_fd=dfd)
    except OSError:
        pass  # best effort: a leftover temp file is harmless


def open_safe_dir(directory: str) -> int:
    """An ``O_DIRECTORY`` fd on ``directory``, checked for a root write; PermissionError naming it if unsafe.

    Safe: a real directory (the last component is not a symlink), owned by root or this
    process's effective uid, writable by neither its group nor others. The checks run on
    the opened fd (``fstat``), so the directory cannot be swapped between check and use.
    """
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(directory):
            raise _unsafe(directory, "is a symlink") from None
        raise
    info = os.fstat(dfd)
    problem = ""
    if info.st_uid not in (0, os.geteuid()):
        problem = "belongs to uid %d" % info.st_uid
    elif info.st_mode & 0o022:
        problem = "is writable by its group or others (mode %04o)" % (info.st_mode & 0o7777)
    if problem:
        os.close(dfd)
        raise _unsafe(directory, problem)
    return dfd


def _unsafe(directory: str, problem: str) -> PermissionError:
    return PermissionError(
        errno.EPERM,
        "directory %s %s: refused, a root write there could be turned against another file"
        " (make it a real directory of root or uid %d, writable by nobody else: mode 0755 or stricter)"
        % (directory, problem, os.geteuid()),
        directory,
    )


def node_write(path: str, content: str, mode: int = 0o644, durable: bool = True) -> None:
    """A node program's write: :func:`atomic_write` in a checked directory (``safe=True``)."""
    atomic_write(path, content, mode, safe=True, durable=durable)


def node_write_json(path: str, data: Any, mode: int = 0o644, durable: bool = True) -> None:
    node_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode, durable)


def _nothing_replaced(exc: OSError, path: str) -> OSError:
    """The same error, saying that nothing was half-written (every caller's message then says so)."""
    return type(exc)(
        exc.errno, "%s; nothing replaced, %s stays as it was" % (exc.strerror or exc, path), exc.filename or path
    )


def atomic_write_json(path: str, data: Any, mode: int = 0o644) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode)


STATE_READ_CAP = 8 << 20  # bytes: no state file of the node programs comes near it
_SAID: Set[str] = set()


def read_state(
    path: str,
    kind: type = dict,
    check: Optional[Callable[[Any], Optional[str]]] = None,
    prog: str = "uma-vllm",
    cap: int = STATE_READ_CAP,
) -> Optional[Any]:
    """A node program's own state file, or None (start fresh) when it is missing or damaged.

    Damaged: not a regular file (a directory, a symlink, a loop), larger than ``cap``,
    empty, not UTF-8, not JSON (truncated), NaN/Infinity, or not of ``kind`` (the JSON
    ``true`` is not a number, a string is not an object); ``check(value)`` may name more
    (a problem string). A damaged file is renamed to ``<path>.damaged-<UTC time>`` (left
    in place and ignored when it cannot be renamed), and one line on stderr (the journal)
    names the file, what was wrong and where it went - once per path and process.
    """
    value, problem = read_record_file(path, kind, check, cap)
    if problem is None:
        return value
    if path not in _SAID:
        _SAID.add(path)
        sys.stderr.write("%s: state file %s %s; %s, starting fresh\n" % (prog, path, problem, _set_aside(path)))
        sys.stderr.flush()
    return None


def read_others_record(path: str, kind: type = dict, prog: str = "uma-vllm") -> Optional[Any]:
    """A record another program owns (the launcher's launch record, a guard's status), read by a
    program that only reports on it (the textfile collector): the value, or None when it is missing
    or damaged. A damaged one is left where it is for its owner and for diagnosis (never renamed by
    a reader) and named once per path and process on stderr (the journal)."""
    value, problem = read_record_file(path, kind)
    key = os.path.realpath(path)  # the latest link and its launch's own path: one file, said once
    if problem is not None and key not in _SAID:
        _SAID.add(key)
        sys.stderr.write("%s: record %s %s; left in place for its owner, not read\n" % (prog, path, problem))
        sys.stderr.flush()
    return value


def read_record_file(
    path: str, kind: type = dict, check: Optional[Callable[[Any], Optional[str]]] = None, cap: int = STATE_READ_CAP
) -> Tuple[Optional[Any], Optional[str]]:
    """The one way the node programs read a record of their own: ``(value, None)``, ``(None, None)``
    when the file is not there, ``(None, problem)`` when it is there but damaged (the problem reads
    after the file's path: "is empty", "is a symlink ...", ``check``'s own words). Never follows a
    symlink, never opens a FIFO or device (no hang), never reads more than ``cap`` bytes, never
    takes NaN/Infinity or a value of another JSON kind; :func:`read_state` sets a damaged one aside,
    a record of the operator's original values is refused instead (it must not be lost)."""
    problem, value = _state_problem(path, kind, check, cap)
    return value, problem


def _state_problem(path: str, kind: type, check: Any, cap: int) -> Any:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return "cannot be examined (%s)" % (exc.strerror or exc), None
    if stat.S_ISLNK(info.st_mode):
        try:
            return "is a symlink (to %r), not a file" % os.readlink(path), None
        except OSError:
            return "is a symlink, not a file", None
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file (%s)" % ("a directory" if stat.S_ISDIR(info.st_mode) else "a special file"), None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            chunks, size = [], 0
            while size <= cap:
                chunk = os.read(fd, min(1 << 20, cap + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        return "cannot be read (%s)" % (exc.strerror or exc), None
    if size > cap:
        return "is larger than %d bytes" % cap, None
    data = b"".join(chunks)
    if not data.strip():
        return "is empty", None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "is not UTF-8 (byte %d)" % exc.start, None
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_record_int, parse_float=_record_float)
    except (ValueError, RecursionError) as exc:
        return "is not valid JSON, truncated or damaged (%s)" % str(exc)[:120], None
    if not isinstance(value, kind) or isinstance(value, bool):
        return "holds a JSON %s, not a JSON %s" % (_json_kind(value), _json_kind(kind())), None
    problem = check(value) if check else None
    return (problem, None) if problem else (None, value)


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not a number" % name)


# No record of the node programs holds a number beyond 64 bits; one that does is damage, and a
# float() of it (a 400-digit int) or arithmetic on it (1e400 read as inf) would be a traceback later.
_RECORD_INT_MAX = 1 << 63


def _record_int(text: str) -> int:
    if len(text) > 20 or abs(int(text)) > _RECORD_INT_MAX:
        raise ValueError("%s is too large for a number" % text[:40])
    return int(text)


def _record_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError("%s is too large for a number" % text[:40])
    return number


def _json_kind(value: Any) -> str:
    for kind, name in ((bool, "boolean"), ((int, float), "number"), (str, "string"), (dict, "object"), (list, "list")):
        if isinstance(value, kind):
            return name
    return "null"


def _set_aside(path: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = "%s.damaged-%s" % (path, stamp)
    count = 1
    while os.path.lexists(target):
        count += 1
        target = "%s.damaged-%s-%d" % (path, stamp, count)
    try:
        os.rename(path, target)
    except OSError as exc:
        return "left in place and ignored (cannot rename it: %s)" % (exc.strerror or exc)
    return "set aside as %s" % target


def read_meminfo(proc_root: str = "/proc") -> Dict[str, int]:
    """/proc/meminfo as a dict of bytes (``{"MemTotal": 25769803776, ...}``)."""
    result: Dict[str, int] = {}
    with open(os.path.join(proc_root, "meminfo"), encoding="ascii", errors="replace") as handle:
        for line in handle:
            key, _unused, rest = line.partition(":")
            fields = rest.split()
            if not fields:
                continue
            try:
                value = int(fields[0])
            except ValueError:
                continue
            if len(fields) > 1 and fields[1] == "kB":
                value *= 1024
            result[key.strip()] = value
    return result


def require_int(
    option: str, value: Any, minimum: Optional[int] = None, maximum: Optional[int] = None, fix: str = ""
) -> int:
    """Coerce ``value`` to int or raise a UmaError that names the option.

    Accepts ints and decimal strings (as they come from inventories); refuses
    bools, floats with a fraction and anything else.
    """
    if isinstance(value, bool):
        raise UmaError(option, value, "is a boolean, not an integer", fix or "Give a whole number.")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and _INT_RE.fullmatch(value):
        number = int(value.strip())
    else:
        raise UmaError(option, value, "is not an integer", fix or "Give a whole number.")
    if minimum is not None and number < minimum:
        raise UmaError(option, value, "is below the minimum %d" % minimum, fix or "Give a value >= %d." % minimum)
    if maximum is not None and number > maximum:
        raise UmaError(option, value, "is above the maximum %d" % maximum, fix or "Give a value <= %d." % maximum)
    return number


_PLAIN_ARG_RE = re.compile(r"[A-Za-z0-9_./+:=@,-]+", re.ASCII)


def systemd_quote(arg: str) -> str:
    """One word of a unit's Exec*= line, quoted by systemd.service(5)'s rules.

    Plain words stay as they are; anything else is double-quoted with C-style
    escapes for backslash, quote, and control characters, ``%%`` for a
    specifier and ``$$`` for a variable, so the value reaches the program as
    one argument and can never start a new line or a new setting.
    """
    text = str(arg)
    if _PLAIN_ARG_RE.fullmatch(text):
        return text
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char == "%":
            out.append("%%")
        elif char == "$":
            out.append("$$")
        elif char == "\n":
            out.append("\\n")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append("\\x%02x" % ord(char))
        else:
            out.append(char)
    return '"%s"' % "".join(out)


def check_path(option: str, value: Any, absolute: bool = True, fix: str = "") -> str:
    """A path option: a string, no NUL or line break, absolute unless told otherwise."""
    if not isinstance(value, str) or not value:
        raise UmaError(option, value, "is not a path", fix or "Give an absolute path.")
    if "\x00" in value or "\n" in value or "\r" in value:
        raise UmaError(option, value, "contains a NUL or line-break character", fix or "Give an absolute path.")
    if absolute and not os.path.isabs(value):
        raise UmaError(option, value, "is not an absolute path", fix or "Give an absolute path.")
    return value


def path_error(err: OSError, options: Dict[str, Any], fix: str = "") -> UmaError:
    """An OSError from a path the options point at, as a UmaError naming the option.

    The option whose value is the longest prefix of the failing file name is
    blamed (the first one when none matches), with the OS's own reason.
    """
    filename = str(err.filename or "")
    best, best_len = None, -1
    for option, value in options.items():
        for candidate in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(candidate, str) or not candidate:
                continue
            if (filename == candidate or filename.startswith(candidate.rstrip("/") + "/")) and len(
                candidate
            ) > best_len:
                best, best_len = option, len(candidate)
    if best is None:
        best = next(iter(options))
    reason = err.strerror or errno.errorcode.get(err.errno or 0, str(err))
    return UmaError(
        best,
        options[best],
        "%s cannot be used (%s)" % (filename or "a path under it", reason),
        fix or "Point %s at a directory/file of the expected kind that root can read and write." % best,
    )
