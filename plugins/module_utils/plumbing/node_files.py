# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's directories, files, secret files and programs, checked and corrected in one task.

The logic of the ``uma.vllm.node_files`` module (pure: no Ansible import; the unit tests call
it on temporary directories). The flow is the collection's (``_flow``):

1. :func:`plan` validates every entry (path, mode, owner, group, content, duplicates,
   parents) and reads the node, touching nothing; any bad entry raises :class:`UmaError`
   naming the option with its index (``files[2].mode``), the value and the fix, so a refusal
   leaves the node exactly as it was;
2. :func:`diff` renders what would change (text for files, placeholders for secret files
   and programs, ``file 0644 root:root`` lines for attributes);
3. :func:`execute` acts, in order: directories (in the order given), the programs' lib dir,
   files, secret files, programs. A file whose content differs is replaced atomically
   (temporary file in the same directory, owner and mode set on it, fsync, rename); a file
   whose only mode/owner/group differ is corrected in place;
4. :func:`result` is the task's return (the same in check mode: what the run leaves).

A secret file's content never leaves this module: not in the result, the diff, a warning or
an error (only its size, and the sha1 checksum ansible.builtin.stat would give).

The programs (``programs: true``) are the node package and its entry scripts
(``plumbing/node_install.py``: ``NODE_MODULES``); their source comes from the module's own payload
through ``node_install.plan_node_files`` and they are installed like any other file here (so a wrong
mode or owner is corrected too, which ``node_install.install_node_files`` does not do).
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import re
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, check_path
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.diff import DifferenceTracker
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.node_install import (
    NodeFile,
    files_fingerprint,
    package_dirs,
    plan_node_files,
)

KINDS = ("directories", "files", "secret_files")
DEFAULT_MODES = {"directories": "0755", "files": "0644", "secret_files": "0600"}
KEYS = {
    "directories": ("path", "mode", "owner", "group"),
    "files": ("path", "content", "mode", "owner", "group"),
    "secret_files": ("path", "content", "mode", "owner", "group"),
}
PROGRAM_MODE = 0o644
PROGRAM_DIR_MODE = 0o755
_MODE_RE = re.compile(r"[0-7]{3,4}", re.ASCII)
_HIDDEN = "(secret, not shown)"


@dataclass(frozen=True)
class Want:
    """One validated entry: what the path must be after the run."""

    option: str  # "files[2]", "programs[uma_vllm_node/base/common.py]"
    kind: str  # directories / files / secret_files / programs
    path: str
    mode: int
    owner: str
    group: str
    uid: int
    gid: int
    content: Optional[bytes] = None  # None: a directory

    @property
    def is_dir(self) -> bool:
        return self.content is None


@dataclass
class Have:
    """What the path is now (``exists`` False: nothing there)."""

    exists: bool
    mode: int = 0
    uid: int = -1
    gid: int = -1
    content: Optional[bytes] = None


@dataclass
class Item:
    want: Want
    have: Have

    @property
    def created(self) -> bool:
        return not self.have.exists

    @property
    def content_changed(self) -> bool:
        return not self.want.is_dir and (self.created or self.have.content != self.want.content)

    @property
    def attrs_changed(self) -> bool:
        have, want = self.have, self.want
        return have.exists and (have.mode, have.uid, have.gid) != (want.mode, want.uid, want.gid)

    @property
    def changed(self) -> bool:
        return self.created or self.content_changed or self.attrs_changed


@dataclass
class Plan:
    items: List[Item]
    lib_dir: Optional[str] = None
    node_files: List[NodeFile] = field(default_factory=list)
    done: List[str] = field(default_factory=list)  # paths execute acted on, in order

    @property
    def changed(self) -> bool:
        return any(item.changed for item in self.items)

    def changed_paths(self) -> List[str]:
        return sorted(item.want.path for item in self.items if item.changed)


# --- validation -------------------------------------------------------------------------------


def check_mode_string(option: str, value: Any) -> int:
    """A mode given as an octal string ("0644", "755", "2775") -> its number."""
    if isinstance(value, str) and _MODE_RE.fullmatch(value):
        return int(value, 8)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        problem = "is a number, not an octal string"
    else:
        problem = "is not a mode of 3 or 4 octal digits"
    raise UmaError(
        option,
        value,
        problem,
        'Give an octal string such as "0644" (quote it in YAML: an unquoted 0644 is read as the number 420).',
    )


def check_entry_path(option: str, value: Any) -> str:
    """An absolute, normalized path without '..' (so duplicates and parents compare as strings)."""
    path = check_path(option, value, fix="Give an absolute path such as /etc/uma-vllm/x.conf.")
    if ".." in path.split("/"):
        raise UmaError(option, value, "has a '..' component", "Give the path without '..'.")
    if os.path.normpath(path) != path:
        raise UmaError(
            option, value, "is not in normal form (a doubled or trailing '/', or a '.' component)",
            "Write it as %r." % os.path.normpath(path),
        )  # fmt: skip
    return path


_ID_RE = re.compile(r"[0-9]{1,10}", re.ASCII)


def _lookup(option: str, value: Any, by_name: Any, by_id: Any, what: str, fix: str) -> int:
    """A name (or a numeric id) that exists on the node -> its id; anything else a refusal."""
    if isinstance(value, str) and value and "\x00" not in value:
        try:
            return by_name(value)
        except (KeyError, ValueError, OverflowError):
            pass
        if _ID_RE.fullmatch(value):
            try:
                return by_id(int(value))
            except (KeyError, ValueError, OverflowError):
                pass
    raise UmaError(option, value, "is not a %s on this node" % what, fix)


def lookup_user(option: str, value: Any) -> int:
    """A user name (or numeric uid) that exists on the node -> its uid."""
    return _lookup(
        option, value, lambda name: pwd.getpwnam(name).pw_uid, lambda uid: pwd.getpwuid(uid).pw_uid, "user",
        "Give an existing user name (create it first, e.g. with ansible.builtin.user).",
    )  # fmt: skip


def lookup_group(option: str, value: Any) -> int:
    """A group name (or numeric gid) that exists on the node -> its gid."""
    return _lookup(
        option, value, lambda name: grp.getgrnam(name).gr_gid, lambda gid: grp.getgrgid(gid).gr_gid, "group",
        "Give an existing group name (create it first, e.g. with ansible.builtin.group).",
    )  # fmt: skip


def check_content(option: str, value: Any, secret: bool) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", errors="surrogateescape")
    shown = _HIDDEN if secret else value
    raise UmaError(option, shown, "is missing or not a string", "Give the file's full content as a string.")


def check_entry(kind: str, index: int, entry: Any) -> Want:
    """One entry of ``directories`` / ``files`` / ``secret_files`` -> a Want (or UmaError)."""
    option = "%s[%d]" % (kind, index)
    secret = kind == "secret_files"
    unknown = sorted(str(key) for key in entry if key not in KEYS[kind])
    if unknown:
        raise UmaError(option + "." + unknown[0], _HIDDEN if secret else entry[unknown[0]], "is not a known key",
                       "Use only %s." % ", ".join(KEYS[kind]))  # fmt: skip
    path = check_entry_path(option + ".path", entry.get("path"))
    mode_value = entry.get("mode")
    mode = check_mode_string(option + ".mode", DEFAULT_MODES[kind] if mode_value is None else mode_value)
    if secret and mode & 0o007:
        raise UmaError(
            option + ".mode", mode_value, "lets every user of the node read or write a secret",
            'Give a mode without permissions for others, such as "0600" or "0640".',
        )  # fmt: skip
    owner = "root" if entry.get("owner") is None else entry.get("owner")
    group = "root" if entry.get("group") is None else entry.get("group")
    uid = lookup_user(option + ".owner", owner)
    gid = lookup_group(option + ".group", group)
    content = None if kind == "directories" else check_content(option + ".content", entry.get("content"), secret)
    return Want(option, kind, path, mode, owner, group, uid, gid, content)


def check_shapes(request: Mapping[str, Any]) -> None:
    """Each of directories / files / secret_files is absent or a list of dictionaries.

    The module runs this on the raw arguments first: ansible-core's own refusal of a bad
    element ("dictionary requested, could not parse JSON or key=value") names no option.
    """
    for kind in KINDS:
        entries = request.get(kind)
        if entries is None:
            continue
        if not isinstance(entries, (list, tuple)):
            raise UmaError(kind, _HIDDEN if kind == "secret_files" else entries, "is not a list",
                           "Give a list of dictionaries.")  # fmt: skip
        for index, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise UmaError("%s[%d]" % (kind, index), _HIDDEN if kind == "secret_files" else entry,
                               "is not a dictionary", "Give a dictionary with at least 'path'.")  # fmt: skip


def check_entries(request: Mapping[str, Any]) -> List[Want]:
    check_shapes(request)
    wants = []
    for kind in KINDS:
        entries = request.get(kind) or ()
        wants.extend(check_entry(kind, index, entry) for index, entry in enumerate(entries))
    return wants


def check_duplicates(wants: Sequence[Want]) -> None:
    seen: Dict[str, str] = {}
    for want in wants:
        if want.path in seen:
            raise UmaError(
                want.option + ".path", want.path, "is also given by %s" % seen[want.path],
                "Give each path once (one entry per directory or file).",
            )  # fmt: skip
        seen[want.path] = want.option


def check_parents(wants: Sequence[Want]) -> None:
    """Every parent exists as a directory, or is a listed directory (for a directory: listed earlier)."""
    listed = set()
    all_dirs = {want.path for want in wants if want.is_dir}
    for want in wants:
        parent = os.path.dirname(want.path)
        known = listed if want.kind == "directories" else all_dirs
        if want.path != "/" and parent not in known and not os.path.isdir(parent):
            where = "earlier in directories" if want.kind == "directories" else "in directories"
            problem = (
                "its parent %s exists and is not a directory" % parent
                if os.path.lexists(parent)
                else "its parent directory %s does not exist and is not listed %s" % (parent, where)
            )
            raise UmaError(want.option + ".path", want.path, problem,
                           "List %s %s (parents first), or create it before this task." % (parent, where))  # fmt: skip
        if want.is_dir:
            listed.add(want.path)


# --- reading the node ---------------------------------------------------------------------------


def _os_error(want: Want, err: OSError, doing: str, after: str = "") -> UmaError:
    """An OSError as a refusal naming the entry and the path; never a secret's content."""
    reason = err.strerror or type(err).__name__
    where = err.filename if err.filename and err.filename != want.path else None
    return UmaError(
        want.option + ".path", want.path,
        "could not be %s (%s%s)%s" % (doing, reason, ": %s" % where if where else "", after),
        "Run the task with become: true, or fix the path on the node.",
    )  # fmt: skip


def read_have(want: Want) -> Have:
    """The path as it is now. A directory may be a symlink to one; a file must be a regular file."""
    try:
        info = os.stat(want.path) if want.is_dir else os.lstat(want.path)
    except FileNotFoundError:
        if want.is_dir and os.path.islink(want.path):
            raise UmaError(want.option + ".path", want.path, "is a symbolic link to nothing",
                           "Remove the link or give another path; nothing was changed.") from None  # fmt: skip
        return Have(exists=False)
    except OSError as err:
        raise _os_error(want, err, "read") from None
    if want.is_dir and not stat.S_ISDIR(info.st_mode):
        raise UmaError(want.option + ".path", want.path, "exists and is not a directory",
                       "Remove it or give another path; nothing was changed.")  # fmt: skip
    if not want.is_dir and stat.S_ISLNK(info.st_mode):
        raise UmaError(want.option + ".path", want.path, "is a symbolic link",
                       "Give the link's target as the path, or remove the link; nothing was changed.")  # fmt: skip
    if not want.is_dir and not stat.S_ISREG(info.st_mode):
        raise UmaError(want.option + ".path", want.path, "exists and is not a regular file",
                       "Remove it or give another path; nothing was changed.")  # fmt: skip
    have = Have(True, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
    if not want.is_dir:
        try:
            with open(want.path, "rb") as handle:
                have.content = handle.read()
        except OSError as err:
            raise _os_error(want, err, "read") from None
    return have


def program_wants(lib_dir: str, listed: Sequence[Want], owner: Tuple[str, str]) -> Tuple[List[Want], List[NodeFile]]:
    """The node package and its entry scripts (and lib_dir, when missing and not listed) as entries,
    from the module payload; the package's own directories are the collection's, so always entries."""
    node_files = plan_node_files(lib_dir)
    uid = lookup_user("programs (owner)", owner[0])
    gid = lookup_group("programs (group)", owner[1])
    wants = []
    listed_paths = {want.path for want in listed}
    if lib_dir not in listed_paths and not os.path.isdir(lib_dir):
        wants.append(Want("lib_dir", "programs", lib_dir, PROGRAM_DIR_MODE, owner[0], owner[1], uid, gid))
    for directory in package_dirs(lib_dir):
        if directory not in listed_paths:
            wants.append(
                Want(
                    "programs[%s]" % os.path.relpath(directory, lib_dir),
                    "programs",
                    directory,
                    PROGRAM_DIR_MODE,
                    owner[0],
                    owner[1],
                    uid,
                    gid,
                )
            )
    for item in node_files:
        content = item.content.encode("utf-8")
        wants.append(Want("programs[%s]" % item.name, "programs", item.path, PROGRAM_MODE, owner[0], owner[1], uid,
                          gid, content))  # fmt: skip
    return wants, node_files


def plan(
    request: Mapping[str, Any],
    program_owner: Tuple[str, str] = ("root", "root"),
) -> Plan:
    """Validate everything and read the node; touches nothing."""
    wants = check_entries(request)
    lib_dir, node_files = None, []
    if request.get("programs"):
        lib_dir = check_entry_path("lib_dir", request.get("lib_dir"))
        programs, node_files = program_wants(lib_dir, wants, program_owner)
        wants.extend(programs)
    check_duplicates(wants)
    check_parents(wants)
    return Plan([Item(want, read_have(want)) for want in wants], lib_dir, node_files)


# --- acting ---------------------------------------------------------------------------------------


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, content: bytes, mode: int, uid: int, gid: int) -> None:
    """Replace ``path`` so readers see the old or the new file, never a part of it.

    The temporary file (created 0600 in the same directory) gets its owner and mode before the
    rename; a failure removes it and leaves the old file as it was.
    """
    directory, base = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % base, suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            info = os.fstat(handle.fileno())
            if (info.st_uid, info.st_gid) != (uid, gid):
                os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def set_attributes(path: str, have: Have, want: Want) -> None:
    """Owner first (a chown may clear setuid/setgid bits), then the mode."""
    if (have.uid, have.gid) != (want.uid, want.gid):
        os.chown(path, want.uid, want.gid, follow_symlinks=want.is_dir)
    if have.mode != want.mode or (have.uid, have.gid) != (want.uid, want.gid):
        os.chmod(path, want.mode, follow_symlinks=want.is_dir)


def apply(item: Item) -> None:
    want, have = item.want, item.have
    if want.is_dir:
        if item.created:
            os.mkdir(want.path, 0o700)  # nobody else sees it before its owner and mode are set
            info = os.stat(want.path)
            have = Have(True, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
        set_attributes(want.path, have, want)
    elif item.content_changed:
        write_atomic(want.path, want.content or b"", want.mode, want.uid, want.gid)
    else:
        set_attributes(want.path, have, want)


def execute(plan_: Plan) -> List[str]:
    """Act on every item that differs, in plan order; returns the paths acted on."""
    for item in plan_.items:
        if not item.changed:
            continue
        try:
            apply(item)
        except OSError as err:
            doing = "created" if item.created else "written" if item.content_changed else "corrected"
            after = "; the file stays as it was" if item.content_changed and not item.created else ""
            if plan_.done:
                after += "; already done: %s" % ", ".join(plan_.done)
            raise _os_error(item.want, err, doing, after) from None
        plan_.done.append(item.want.path)
    return list(plan_.done)


# --- what the task returns --------------------------------------------------------------------------


def sha1(content: Optional[bytes]) -> Optional[str]:
    return None if content is None else hashlib.sha1(content).hexdigest()  # nosec: Ansible's checksum


def result(plan_: Plan, _done: Any = None) -> Dict[str, Any]:
    """The task's return: the state the run leaves (in check mode: would leave)."""
    files = {
        item.want.path: {"checksum": sha1(item.want.content), "changed": item.changed, "created": item.created}
        for item in plan_.items
        if item.want.kind in ("files", "secret_files")
    }
    directories = {
        item.want.path: {"changed": item.changed, "created": item.created}
        for item in plan_.items
        if item.want.kind == "directories"
    }
    programs = None
    if plan_.lib_dir is not None:
        programs = {
            "lib_dir": plan_.lib_dir,
            "changed_paths": sorted(i.want.path for i in plan_.items if i.want.kind == "programs" and i.changed),
            "fingerprint": files_fingerprint(plan_.node_files),
        }
    return {
        "changed": plan_.changed,
        "changed_paths": plan_.changed_paths(),
        "files": files,
        "directories": directories,
        "programs": programs,
    }


def failed_result(plan_: Plan) -> Dict[str, Any]:
    """Beside a refusal during execute: what was already done (honest ``changed``)."""
    return {"changed": bool(plan_.done), "changed_paths": sorted(plan_.done)}


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def attributes_text(is_dir: bool, mode: int, owner: str, group: str) -> str:
    return "%s %04o %s:%s\n" % ("directory" if is_dir else "file", mode, owner, group)


def _content_text(want: Want, content: Optional[bytes], when: str) -> str:
    """A file's content as diff text; for a secret or a program only a placeholder."""
    if content is None:
        return ""
    if want.kind == "secret_files":
        return "(secret content %s, %d bytes)\n" % (when, len(content))
    if want.kind == "programs":
        return "(program %s, %d bytes, sha256 %s)\n" % (
            os.path.basename(want.path),
            len(content),
            hashlib.sha256(content).hexdigest()[:16],
        )
    return content.decode("utf-8", errors="replace")


def diff(plan_: Plan) -> List[Dict[str, str]]:
    """One header-and-text entry per change: a file's content (a new file's attributes in its header),
    a directory created (``absent`` before), or the attributes corrected (``file 0644 root:root``)."""
    tracker = DifferenceTracker()
    for item in plan_.items:
        want, have = item.want, item.have
        attributes = attributes_text(want.is_dir, want.mode, want.owner, want.group)
        if item.content_changed:
            # a new file: one entry, its attributes in the header
            name = "%s (new %s)" % (want.path, attributes.strip()) if item.created else want.path
            before, after = _content_text(want, have.content, "before"), _content_text(want, want.content, "after")
            tracker.add(name, before, after)
        if want.is_dir and item.created:
            tracker.add(want.path, "absent\n", attributes)
        elif item.attrs_changed:
            before = attributes_text(want.is_dir, have.mode, _user(have.uid), _group(have.gid))
            tracker.add("%s (type, mode, owner:group)" % want.path, before, attributes)
    return tracker.text_diffs()
