"""The README's quick start as a list of commands, and the check that a test knows each of them.

The quick start is the part of README.md between ``<!-- quickstart:begin`` and
``<!-- quickstart:end -->``. Its commands are every line of its ```bash blocks (a line ending in
``\\`` continues on the next) and every inline code span whose first word is a program
(``PROGRAMS``), in the README's order. tests/integration/test_quickstart_live.py maps each
command, by its exact text, to what it runs in the lab; :func:`check_known` refuses a README
whose commands are not exactly those (one added, changed, removed or moved): the README and
the tested commands cannot drift apart silently.
"""

from __future__ import annotations

import re
from typing import List, Sequence

BEGIN = "<!-- quickstart:begin"
END = "<!-- quickstart:end -->"
# An inline code span is a command when its first word is one of these.
PROGRAMS = (
    "ansible", "ansible-playbook", "ansible-galaxy", "ansible-vault", "ansible-doc", "cp", "mv", "curl",
    "systemctl", "journalctl", "docker", "sudo", "ssh", "git", "pip", "python3", "bash", "sh", "export",
)  # fmt: skip
SPAN = re.compile(r"`([^`\n]+)`")


class QuickstartDrift(AssertionError):
    """The README's quick start and the commands the test runs are not the same."""


def section(readme: str) -> str:
    """The text between the quick start's markers (exactly one pair)."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise QuickstartDrift("README.md must hold one '%s ...' and one '%s' after it" % (BEGIN, END))
    return readme[readme.index(BEGIN) : readme.index(END)]


def commands(readme: str) -> List[str]:
    """Every command of the quick start, in order (continuation lines joined, blank lines dropped)."""
    found: List[str] = []
    fence = None
    pending = ""
    for raw in section(readme).splitlines():
        line = raw.strip()
        if line.startswith("```"):
            if fence is None:
                fence = line[3:].strip()
                if fence not in ("bash", "sh", "console", "shell"):
                    raise QuickstartDrift("quick start: a ```%s block; only bash blocks hold commands" % fence)
            else:
                if pending:
                    raise QuickstartDrift("quick start: a bash block ends in a continuation: %r" % pending)
                fence = None
            continue
        if fence is not None:
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            text = (pending + line).strip()
            pending = ""
            if text:
                found.append(text)
            continue
        for span in SPAN.findall(raw):
            if span.split()[0] in PROGRAMS:
                found.append(span.strip())
    if fence is not None:
        raise QuickstartDrift("quick start: a ```%s block is not closed" % fence)
    return found


def check_known(readme: str, known: Sequence[str]) -> List[str]:
    """The quick start's commands; QuickstartDrift unless they are exactly ``known``, in order."""
    have = commands(readme)
    if have == list(known):
        return have
    unknown = [c for c in have if c not in known]
    missing = [c for c in known if c not in have]
    lines = ["README.md's quick start and the commands the quick-start test runs differ:"]
    lines += ["  in the README, not known to the test: %s" % c for c in unknown]
    lines += ["  known to the test, not in the README: %s" % c for c in missing]
    if not unknown and not missing:
        lines.append("  the same commands in another order: %s" % have)
    lines.append("Change tests/integration/test_quickstart_live.py (STEPS) with the README, or the README back.")
    raise QuickstartDrift("\n".join(lines))
