# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checks every node-side configuration shares: one set, used by the three validators.

Node-side (stdlib only; shipped beside ``uma_launch.py``, ``uma_guard.py`` and
``uma_watchdog.py``). The launcher's engine and node configs (``node/launch/config.py``),
the watchdog's config (``node/watchdog/logic.py``) and the guard's options
(``node/guard/config.py``) check their values with these functions, so a number is a
finite number in a named range everywhere (no NaN, no Infinity, no 1e308, no
``true`` for 1), a boolean is a JSON boolean (the string ``"false"`` is not false),
a path is absolute without NUL or line break, and a config file is read strictly
(``read_config``: a regular UTF-8 JSON object of bounded size, or a refusal naming
the file). Each refusal is a :class:`UmaError` naming the option, the value and the fix.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from typing import Any, Dict, Iterable, Optional, Union

from .common import UmaError, check_path

# a configuration file is small; a huge one is damage (or an attack), never read whole
MAX_CONFIG_BYTES = 1 << 20
WEEK_S = 604800.0
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# The one home of the environment-name rules (the launcher's env, the engine model's env and secrets,
# the planner's checks): a variable's name, and the names and flags that are secrets. Secrets travel only
# through the 0600 EnvironmentFile: a secret-looking env key or a secret flag on a command line is
# refused, naming the key or flag, never echoing its value.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$", re.ASCII)
SECRET_ENV_RE = re.compile(r"(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}

Number = Union[int, float]


def _fmt(bound: Number) -> str:
    return "%d" % bound if float(bound).is_integer() else "%g" % bound


def number(
    option: str,
    value: Any,
    minimum: Number,
    maximum: Number,
    fix: str,
    *,
    integer: bool = False,
    above: bool = False,
    strings: bool = False,
) -> Number:
    """A finite number in [minimum, maximum] ((minimum, maximum] with ``above``).

    JSON numbers only: a boolean is not 1 or 0, a string is not a number (``strings``
    lets a command line's decimal text through). ``integer`` asks for a whole number.
    """
    if isinstance(value, bool):
        raise UmaError(option, value, "is a boolean, not a number", fix)
    if isinstance(value, str) and strings:
        value = _from_text(option, value, fix, integer)
    if isinstance(value, str):
        raise UmaError(option, value, "is a string, not a number", fix)
    if not isinstance(value, (int, float)):
        raise UmaError(option, value, "is not a number", fix)
    low = "> %s" % _fmt(minimum) if above else ">= %s" % _fmt(minimum)
    bounds = "must be %s and <= %s" % (low, _fmt(maximum))
    if isinstance(value, float) and not math.isfinite(value):
        raise UmaError(option, value, "is not a finite number (%s)" % bounds, fix)
    if integer and not isinstance(value, int):
        if not value.is_integer():
            raise UmaError(option, value, "is not a whole number", fix)
        value = int(value)
    if (value <= minimum if above else value < minimum) or value > maximum:
        raise UmaError(option, value, "is out of range (%s)" % bounds, fix)
    return value


def _from_text(option: str, value: str, fix: str, integer: bool) -> Number:
    """A command line's number: ASCII decimal text ("nan" and "inf" parse, to be refused as not finite)."""
    if not value.isascii():
        raise UmaError(option, value, "is not a number (digits 0-9 only)", fix)
    if integer and re.fullmatch(r"\s*[-+]?[0-9]+\s*", value):
        return int(value)
    try:
        return float(value)
    except ValueError:
        raise UmaError(option, value, "is not a number", fix) from None


def seconds(option: str, value: Any, maximum: Number, fix: str, minimum: Number = 0, above: bool = True) -> float:
    """A duration: a finite number of seconds, by default in (0, maximum]."""
    return float(number(option, value, minimum, maximum, fix, above=above))


def boolean(option: str, value: Any, fix: str = "Give true or false.") -> bool:
    """A JSON boolean: not the string "false", not 0 or 1."""
    if not isinstance(value, bool):
        raise UmaError(option, value, "is not a boolean (true or false)", fix)
    return value


def path(option: str, value: Any, fix: str, absolute: bool = True, optional: bool = False) -> Optional[str]:
    """A path: a non-empty string, no NUL or line break, absolute unless told otherwise."""
    if value is None and optional:
        return None
    return check_path(option, value, absolute, fix)


def text(option: str, value: Any, fix: str, pattern: Optional[str] = None, optional: bool = False) -> Optional[str]:
    """A string without control characters (that could start a new line in a log or a unit), matching ``pattern``."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise UmaError(option, value, "is not a non-empty string", fix)
    if _CONTROL_RE.search(value):
        raise UmaError(option, value, "contains a control character (NUL, line break, ...)", fix)
    if pattern is not None and not re.fullmatch(pattern, value):
        raise UmaError(option, value, "is not of the expected form", fix)
    return value


def url(option: str, value: Any, fix: str, schemes: Iterable[str] = ("http", "https")) -> str:
    """An http(s) URL: a string with a host, without spaces or control characters."""
    prefixes = tuple("%s://" % s for s in schemes)
    if not isinstance(value, str) or not value.startswith(prefixes) or len(value) <= len(value.split("://")[0]) + 3:
        raise UmaError(option, value, "is not an %s URL" % "/".join(schemes), fix)
    if any(c.isspace() for c in value) or _CONTROL_RE.search(value):
        raise UmaError(option, value, "contains a space or a control character", fix)
    return value


def known_keys(raw: Dict[str, Any], known: Iterable[str], what: str) -> None:
    """Refuse the first key that is not an option (a typo is never silently ignored)."""
    known = list(known)
    for key, value in raw.items():
        if key not in known:
            shown = ", ".join(k for k in known if not k.startswith("_"))
            raise UmaError(key, value, "is not %s option" % what, "Remove it or use one of: %s." % shown)


def read_config(file_path: str, option: str, fix: str) -> Dict[str, Any]:
    """A configuration file as a dict, or UmaError naming ``option``, the file and what is wrong with it.

    Refused: missing, unreadable, a directory or anything but a regular file (a FIFO would
    hang the reader), a symlink loop, larger than MAX_CONFIG_BYTES, empty, not UTF-8, not
    JSON (NaN, Infinity and numbers like 1e400 that overflow to it included, anywhere in the
    file: the launch plan's numbers too), nested too deep, or not a JSON object.
    """
    check_path(option, file_path, False, fix)
    try:
        info = os.stat(file_path)
    except OSError as err:
        raise UmaError(option, file_path, "cannot be read (%s)" % (err.strerror or err), fix) from None
    if stat.S_ISDIR(info.st_mode):
        raise UmaError(option, file_path, "is a directory, not a JSON file", fix)
    if not stat.S_ISREG(info.st_mode):
        raise UmaError(option, file_path, "is not a regular file", fix)
    if info.st_size > MAX_CONFIG_BYTES:
        raise UmaError(option, file_path, "is larger than %d bytes (damaged?)" % MAX_CONFIG_BYTES, fix)
    try:
        with open(file_path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise UmaError(option, file_path, "cannot be read (%s)" % (err.strerror or err), fix) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UmaError(option, file_path, "is larger than %d bytes (damaged?)" % MAX_CONFIG_BYTES, fix)
    try:
        body = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UmaError(option, file_path, "is not UTF-8 text (byte %d)" % err.start, fix) from None
    if not body.strip():
        raise UmaError(option, file_path, "is empty", fix)
    try:
        raw = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise UmaError(option, file_path, "is nested too deep to be a configuration", fix) from None
    except ValueError as err:
        raise UmaError(option, file_path, "is not valid JSON (%s)" % str(err).splitlines()[0][:200], fix) from None
    if not isinstance(raw, dict):
        raise UmaError(option, file_path, "is not a JSON object (it holds a %s)" % type(raw).__name__, fix)
    return raw


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not a JSON number" % name)


def _finite(text: str) -> float:
    """A JSON number that overflows a float (1e400 would be Infinity): refused, anywhere in the file."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError("%s is too large for a number" % text[:40])
    return number


# a shared key file: a line of text (the role writes 64 hex digits), never a whole disk
KEY_MIN_CHARS = 32
KEY_MAX_BYTES = 4096


def secret_key(option: str, file_path: Any, owners: Iterable[int] = (0,)) -> bytes:
    """The key in a secret file: a regular file (not a symlink) owned by root (or one of
    ``owners``), readable by its owner only (mode 0600 or 0400), of KEY_MIN_CHARS to
    KEY_MAX_BYTES printable characters. The key itself is never in the refusal."""
    fix = "Give the absolute path of a 0600 root-owned file of at least %d characters (the role writes it)." % (
        KEY_MIN_CHARS
    )
    check_path(option, file_path, True, fix)
    try:
        handle = os.open(file_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise UmaError(option, file_path, "cannot be read (%s)" % (err.strerror or err), fix) from None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise UmaError(option, file_path, "is not a regular file", fix)
        if info.st_uid not in tuple(owners):
            raise UmaError(option, file_path, "is owned by uid %d, not root" % info.st_uid, fix)
        if info.st_mode & 0o077:
            raise UmaError(option, file_path, "has mode %04o: group or others may read it" % (info.st_mode & 0o7777),
                           fix)  # fmt: skip
        if info.st_size > KEY_MAX_BYTES:
            raise UmaError(option, file_path, "is larger than %d bytes" % KEY_MAX_BYTES, fix)
        raw = os.read(handle, KEY_MAX_BYTES + 1)
    finally:
        os.close(handle)
    key = raw.strip()
    if len(key) < KEY_MIN_CHARS or len(raw) > KEY_MAX_BYTES or any(b < 0x21 or b > 0x7E for b in key):
        raise UmaError(option, file_path, "does not hold a key of %d to %d printable characters on one line" % (
            KEY_MIN_CHARS, KEY_MAX_BYTES), fix)  # fmt: skip
    return key
