"""The quick-start test's drift check (tests/integration/_quickstart.py, issue 21 item 8).

tests/integration/test_quickstart_live.py runs README.md's quick start in the lab; before it runs
anything it checks that the README's commands are exactly the ones it knows (STEPS). Proven here,
without a lab: today's README passes, and a README with a command added, changed, removed or
moved (in a bash block or as an inline command), a lost marker or an open block fails, naming
the command.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import _quickstart as qs
import test_quickstart_live as live

README = (ROOT / "README.md").read_text()
KNOWN = [command for command, _action in live.STEPS]
CURL = "curl -s http://10.0.0.11:8000/v1/completions \\"


def test_todays_readme_is_what_the_test_runs():
    assert qs.check_known(README, KNOWN) == KNOWN
    assert {action for _command, action in live.STEPS} <= {n[5:] for n in dir(live) if n.startswith("step_")}


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        # an extra command in a bash block
        ("cp -r inventories/spark ~/sparks\n", "cp -r inventories/spark ~/sparks\n   sudo reboot\n", "sudo reboot"),
        # a changed option
        ("--ask-vault-pass --check --diff", "--ask-vault-pass --check", "--check\n"),
        # a changed address in a continued line
        (CURL, CURL.replace("8000", "8001"), "8001/v1/completions"),
        # a new inline command in the prose
        ("4. Prove it serves", "4. Run `systemctl restart uma-vllm@qwen3-next`, then prove it serves",
         "systemctl restart"),
        # the undo command as it was before issue 21 (it cannot read the vault without a password)
        ("restore -i ~/sparks -u <ssh user> -K --ask-vault-pass`\n", "restore -i ~/sparks`\n",
         "uma.vllm.restore -i ~/sparks\n"),
    ],
)  # fmt: skip
def test_a_changed_readme_fails_naming_the_command(old, new, named):
    assert README.count(old) == 1, old
    with pytest.raises(qs.QuickstartDrift) as raised:
        qs.check_known(README.replace(old, new), KNOWN)
    assert named.strip() in str(raised.value)


def test_a_removed_or_moved_command_fails():
    run = "   ansible-playbook uma.vllm.site -i ~/sparks -u <ssh user> -K --ask-vault-pass\n"
    check = run.replace("\n", " --check --diff\n")
    assert README.count(run) == 1 and README.count(check) == 1
    with pytest.raises(qs.QuickstartDrift, match="known to the test, not in the README: ansible-playbook"):
        qs.check_known(README.replace(run, ""), KNOWN)
    swapped = README.replace(check, "@@").replace(run, check).replace("@@", run)
    with pytest.raises(qs.QuickstartDrift, match="the same commands in another order"):
        qs.check_known(swapped, KNOWN)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (qs.END, ""),  # no end marker
        (qs.BEGIN, qs.BEGIN + " -->\n" + qs.BEGIN),  # two begin markers
        ("   ```bash\n   ansible-galaxy", "   ```python\n   ansible-galaxy"),  # commands in a block of another language
        (CURL + "\n", CURL + "\n   ```\n"),  # a block that ends in a continuation
    ],
)
def test_a_broken_quick_start_section_fails(old, new):
    assert old in README
    with pytest.raises(qs.QuickstartDrift):
        qs.check_known(README.replace(old, new, 1), KNOWN)
