# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small helpers around ``systemctl`` and ``systemd-run`` (private to the collection).

Every call goes through an injected *runner* ``runner(argv) -> (rc, stdout, stderr)``
(the modules pass ``AnsibleModule.run_command``), so the unit tests replace the
node's systemd with a fake and the Molecule scenarios exercise the real one.
Nothing here imports Ansible.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .common import UmaError
from .paths import ENGINE_NAME_PATTERN

Runner = Callable[[List[str]], Tuple[int, str, str]]

# systemd's own rule is [A-Za-z0-9:_.\-] plus "@" for templates; the collection
# only builds unit names from a safe subset so nothing needs escaping.
NAME_RE = re.compile(ENGINE_NAME_PATTERN)
FINGERPRINT_RE = re.compile(r"\[sha256:([0-9a-f]{8,64})\]")

SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "MainPID", "Description", "Result")


def check_name(option: str, value: object) -> str:
    """A name that can be embedded in a unit name and a file name as-is."""
    if not isinstance(value, str) or not NAME_RE.match(value) or ".." in value:
        raise UmaError(
            option,
            value,
            "is not a safe unit-name fragment",
            "Use 1-64 characters from A-Z a-z 0-9 _ . - starting with a letter or digit (e.g. 'llama70b').",
        )
    return value


def parse_show(text: str) -> Dict[str, str]:
    """``systemctl show -p A,B`` output (``KEY=value`` lines, any order) as a dict."""
    result: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            result[key.strip()] = value
    return result


def description_fingerprint(description: str) -> Optional[str]:
    match = FINGERPRINT_RE.search(description or "")
    return match.group(1) if match else None


class Systemd:
    """The node's service manager, driven through ``runner``."""

    def __init__(
        self, runner: Runner, systemctl: Optional[str] = "systemctl", systemd_run: Optional[str] = "systemd-run"
    ) -> None:
        self.runner = runner
        self.systemctl = systemctl
        self.systemd_run = systemd_run

    @classmethod
    def for_module(cls, module: Any) -> Systemd:
        """The node's systemd as an AnsibleModule sees it (``run_command``, binaries from PATH)."""
        return cls(module.run_command, module.get_bin_path("systemctl"), module.get_bin_path("systemd-run"))

    # -- queries -----------------------------------------------------------
    def require(self, option: str, value: object) -> None:
        """Refuse (naming ``option``) when the node has no usable systemd."""
        if not self.systemctl or not self.systemd_run:
            raise UmaError(
                option,
                value,
                "needs systemd on the node, but systemctl/systemd-run were not found",
                "Run it against a node booted with systemd (DGX OS, Ubuntu, Debian, JetPack).",
            )
        rc, out, err = self.runner([self.systemctl, "is-system-running"])
        state = (out or "").strip().splitlines()[-1:] or [""]
        if state[0] in ("offline", "unknown", "") and rc != 0:
            raise UmaError(
                option,
                value,
                "needs a running systemd on the node (systemctl is-system-running: %s)"
                % ((out or err or "").strip() or "rc=%d" % rc),
                "Run it against a node booted with systemd (PID 1), not a plain container.",
            )

    def show(self, unit: str, properties: Sequence[str] = SHOW_PROPERTIES) -> Dict[str, str]:
        rc, out, err = self.runner([self.systemctl, "show", unit, "-p", ",".join(properties)])
        if rc != 0:
            raise UmaError(
                "name", unit, "could not be queried (%s)" % (err or out).strip(), "Check systemd on the node."
            )
        values = parse_show(out)
        for key in properties:
            values.setdefault(key, "")
        return values

    def is_enabled(self, unit: str) -> str:
        _rc, out, _err = self.runner([self.systemctl, "is-enabled", unit])
        return (out or "").strip() or "unknown"

    def journal_tail(self, unit: str, lines: int = 15) -> str:
        rc, out, _err = self.runner(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"])
        return (out or "").strip() if rc == 0 else ""

    # -- actions -----------------------------------------------------------
    def _act(self, argv: List[str], what: str) -> str:
        rc, out, err = self.runner(argv)
        if rc != 0:
            raise UmaError(
                "state",
                what,
                "failed: %s (rc=%d: %s)" % (" ".join(argv), rc, (err or out).strip()),
                "Run with become: true (systemd's system manager needs root); else check 'journalctl -xe' on the node.",
            )
        return out

    def daemon_reload(self) -> None:
        self._act([self.systemctl, "daemon-reload"], "daemon-reload")

    def enable(self, unit: str, now: bool = False) -> None:
        argv = [self.systemctl, "enable"] + (["--now"] if now else []) + [unit]
        self._act(argv, "enable %s" % unit)

    def start(self, unit: str) -> None:
        self._act([self.systemctl, "start", unit], "start %s" % unit)

    def stop(self, unit: str) -> None:
        """Stop ``unit`` and wait for it; a unit that is not loaded (rc 5) is already stopped."""
        rc, out, err = self.runner([self.systemctl, "stop", unit])
        if rc not in (0, 5):
            raise UmaError(
                "state",
                "stop %s" % unit,
                "failed: systemctl stop %s (rc=%d: %s)" % (unit, rc, (err or out).strip()),
                "Check 'systemctl status %s' on the node." % unit,
            )

    def reset_failed(self, unit: str) -> None:
        # Fails harmlessly when the unit is not loaded or not failed.
        self.runner([self.systemctl, "reset-failed", unit])

    def reset_start_limit(self, unit: str) -> None:
        """Clear ``unit``'s start rate limit (``reset-failed``, which a running unit keeps running through);
        unlike ``reset_failed`` a refusal is an error: the caller says whether the limit was cleared."""
        self._act([self.systemctl, "reset-failed", unit], "reset-failed %s" % unit)

    def run(
        self,
        unit: str,
        command: Sequence[str],
        description: str,
        properties: Iterable[str] = (),
        timer_properties: Iterable[str] = (),
        on_active: Optional[int] = None,
        setenv: Optional[Dict[str, str]] = None,
        collect: bool = True,
    ) -> None:
        """Start ``command`` as the transient unit ``unit`` (a timer with ``on_active``)."""
        argv = [self.systemd_run, "--quiet", "--unit", unit, "--description", description]
        if collect:
            argv.append("--collect")
        if on_active is not None:
            argv.append("--on-active=%ds" % on_active)
        for prop in properties:
            argv.append("--property=%s" % prop)
        for prop in timer_properties:
            argv.append("--timer-property=%s" % prop)
        for key, value in sorted((setenv or {}).items()):
            argv.append("--setenv=%s=%s" % (key, value))
        argv.extend(command)
        self._act(argv, "systemd-run %s" % unit)
