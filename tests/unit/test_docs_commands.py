"""Every command a user copies from the README and the docs runs as the quick start's user runs it
(issue 34 item 6): the installed collection's playbook from any directory (``uma.vllm.<playbook>``,
one that exists), the inventory copied to ``~/sparks``, ``-u <ssh user>``, ``-K`` (a DGX OS user's sudo
asks a password) and ``--ask-vault-pass`` (the quick start encrypts the vault; every play reads it).
Commands against the lab's inventory (``-i inventories/lab``, no vault, reached as root) are the
developers' and exempt."""

from __future__ import annotations

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOKS = {os.path.basename(p)[: -len(".yml")] for p in glob.glob(os.path.join(ROOT, "playbooks", "*.yml"))}
DOCS = [
    "README.md",
    *sorted(glob.glob("docs/*.md", root_dir=ROOT)),
    *sorted(glob.glob("roles/*/README.md", root_dir=ROOT)),
]

# a command: `ansible-playbook` followed by an option, a playbook name or a .yml path; `ansible HOSTS -i|-m`;
# it ends at a backtick, a shell comment or the end of the line
COMMAND = re.compile(
    r"(?:^|[`\s])(ansible-playbook\s+(?:-|uma\.vllm\.|\S+\.yml)[^`#\n]*|ansible\s+\S+\s+-[im]\s[^`#\n]*)"
)
NEEDED = (("-i ~/sparks", "the inventory the quick start copies (-i ~/sparks)"),
          ("-u <ssh user>", "the SSH user (-u <ssh user>)"),
          (" -K ", "the SSH user's sudo password (-K)"),
          ("--ask-vault-pass", "the vault's password (--ask-vault-pass)"))  # fmt: skip


def problems(text, name):
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in COMMAND.finditer(line):
            command = " ".join(match.group(1).split())
            if "inventories/lab" in command:
                continue
            where = "%s:%d: %r" % (name, number, command)
            out.extend("%s lacks %s" % (where, why) for flag, why in NEEDED if flag not in " %s " % command)
            if command.startswith("ansible-playbook"):
                playbook = command.split()[1]
                if not playbook.startswith("uma.vllm."):
                    out.append("%s runs %r: give the installed collection's playbook (uma.vllm.<playbook>), which"
                               " runs from any directory" % (where, playbook))  # fmt: skip
                elif playbook[len("uma.vllm.") :] not in PLAYBOOKS:
                    out.append("%s: %r is not one of the collection's playbooks (%s)"
                               % (where, playbook, ", ".join(sorted(PLAYBOOKS))))  # fmt: skip
    return out


def test_every_command_in_the_readme_and_the_docs_is_the_quick_starts_users():
    found, bad = 0, []
    for name in DOCS:
        with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
            text = handle.read()
        found += sum(1 for line in text.splitlines() for match in COMMAND.finditer(line))
        bad.extend(problems(text, name))
    assert found >= 20, found  # the docs hold the commands: the pattern still finds them
    assert not bad, "\n".join(bad)


GOOD = "ansible-playbook uma.vllm.status -i ~/sparks -u <ssh user> -K --ask-vault-pass"


@pytest.mark.parametrize(
    "line, named",
    [
        ("ansible-playbook -i inventories/spark playbooks/status.yml --ask-vault-pass", "-i ~/sparks"),
        ("```\nansible-playbook uma.vllm.status -i ~/sparks --ask-vault-pass\n```", "-u <ssh user>"),
        ("`ansible-playbook uma.vllm.site -i ~/sparks -u <ssh user> --check` shows it", "--ask-vault-pass"),
        ("ansible-playbook -i ~/sparks -u <ssh user> --ask-vault-pass playbooks/site.yml", "uma.vllm.<playbook>"),
        ("ansible-playbook uma.vllm.stats -i ~/sparks -u <ssh user> --ask-vault-pass", "'uma.vllm.stats' is not one"),
        ("ansible spark -i ~/sparks -m uma.vllm.rdma_facts --ask-vault-pass", "-u <ssh user>"),
        ("run `ansible-playbook uma.vllm.diagnose -l ai2` after", "--ask-vault-pass"),
        ("ansible-playbook uma.vllm.status -i ~/sparks -u <ssh user> --ask-vault-pass", "sudo password (-K)"),
        ("ansible-playbook uma.vllm.status -i ~/sparks -u <ssh user> -Kx --ask-vault-pass", "sudo password (-K)"),
    ],
)
def test_a_command_without_what_the_user_needs_fails_naming_it(line, named):
    found = problems(line, "X.md")
    assert found and named in " ".join(found), found
    assert "X.md:" in found[0]


@pytest.mark.parametrize(
    "line",
    [
        GOOD,
        "`%s --check --diff` shows the plan" % GOOD,
        "%s  # which engine, the last reason" % GOOD,
        "ansible spark -i ~/sparks -u <ssh user> -K -m uma.vllm.rdma_facts -a 'x=1' --ask-vault-pass",
        "ansible-playbook uma.vllm.status -i ~/sparks --ask-vault-pass -u <ssh user> -K",
        "then `ansible-playbook -i inventories/lab playbooks/status.yml` (the lab's nodes need no vault)",
        "the ansible-playbook that benchmarks run",  # prose, not a command
    ],
)
def test_the_quick_starts_commands_and_the_labs_pass(line):
    assert problems(line, "X.md") == []
