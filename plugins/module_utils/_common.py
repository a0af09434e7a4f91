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
import os
import re
import tempfile
from typing import Any, Dict, Optional

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


def atomic_write(path: str, content: str, mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` so that readers see the old or the new file.

    The data goes to a temporary file in the same directory, is flushed to
    disk, then renamed over the target. A failure leaves the old file intact
    and no temporary file behind.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    except OSError as exc:
        raise _nothing_replaced(exc, path) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None:
            raise _nothing_replaced(exc, path) from exc
        raise


def _nothing_replaced(exc: OSError, path: str) -> OSError:
    """The same error, saying that nothing was half-written (every caller's message then says so)."""
    return type(exc)(
        exc.errno, "%s; nothing replaced, %s stays as it was" % (exc.strerror or exc, path), exc.filename or path
    )


def atomic_write_json(path: str, data: Any, mode: int = 0o644) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode)


def read_json(path: str) -> Optional[Any]:
    text = read_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


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
