"""The facts the collection's modules set are read through ``ansible_facts``, never as top-level variables.

ansible-core injects every fact as a top-level variable only while ``inject_facts_as_vars`` is true (its
default, deprecated); with it false (``ANSIBLE_INJECT_FACT_VARS=False``) a bare ``uma_node`` is undefined
and site.yml stopped at node_prep's "Report the platform" (measured on the molecule/cluster lab, 4 Dec
2026: ``'uma_node' is undefined``). ``ansible_facts.uma_node`` works with either setting.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# every fact a module of the collection sets: exit_json(..., ansible_facts={"NAME": ...})
FACTS = sorted(
    {
        name
        for path in (ROOT / "plugins" / "modules").glob("*.py")
        for name in re.findall(r"ansible_facts=\{\s*[\"'](\w+)[\"']", path.read_text())
    }
)


def _readers():
    """Every file whose Jinja Ansible templates: tasks, playbooks, templates, the modules' and filters' EXAMPLES."""
    for pattern in ("roles/**/*.yml", "roles/**/*.j2", "playbooks/**/*.yml", "site.yml", "molecule/**/*.yml",
                    "inventories/**/*.yml", "lab/*.yml", "plugins/filter/*.yml"):  # fmt: skip
        yield from ROOT.glob(pattern)
    yield from (ROOT / "plugins" / "modules").glob("*.py")


def _bare(text, fact):
    """The lines that name FACT as a variable of its own (not as ansible_facts.FACT / ansible_facts['FACT'])."""
    bare = re.compile(r"(?<![\w.'\"\[])%s\b(?!\s*:)" % re.escape(fact))
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in re.finditer(r"\{\{.*?\}\}|\{%.*?%\}|^\s*(?:when|that|until|failed_when|changed_when):.*$", line):
            if bare.search(match.group(0)):
                found.append((number, line.strip()))
    return found


def test_the_modules_set_facts():
    # the list is read from the modules: an empty one would make the next test pass on anything
    assert "uma_node" in FACTS and "uma_rdma" in FACTS, FACTS


def test_no_file_reads_a_collection_fact_as_an_injected_variable():
    offenders = [
        "%s:%d: %s (read ansible_facts.%s)" % (path.relative_to(ROOT), number, line, fact)
        for path in _readers()
        for fact in FACTS
        for number, line in _bare(path.read_text(), fact)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_check_finds_a_bare_fact():
    assert _bare("    msg: '{{ uma_node.reason }}'", "uma_node") == [(1, "msg: '{{ uma_node.reason }}'")]
    assert _bare("  when: uma_rdma.present", "uma_rdma") == [(1, "when: uma_rdma.present")]
    assert _bare("    that: uma_node.unified_memory", "uma_node")
    assert not _bare("    msg: '{{ ansible_facts.uma_node.reason }}'", "uma_node")
    assert not _bare("    msg: \"{{ ansible_facts['uma_node'].reason }}\"", "uma_node")
    assert not _bare("    uma_node:", "uma_node")  # RETURN's key
    assert not _bare("  - Sets the fact C(uma_node).", "uma_node")  # prose
