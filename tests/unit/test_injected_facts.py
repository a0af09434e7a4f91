"""The facts the collection's modules set are read through ``ansible_facts``, never as top-level variables.

ansible-core injects every fact as a top-level variable only while ``inject_facts_as_vars`` is true (its
default; an ansible.cfg may turn it off); with it false (``ANSIBLE_INJECT_FACT_VARS=False``) a bare
``uma_node`` is undefined and site.yml stopped at node_prep's "Report the platform" (measured on the
molecule/cluster lab, 4 Dec 2026: ``'uma_node' is undefined``). ``ansible_facts.uma_node`` works with
either setting.
"""

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

# every fact a module of the collection sets: exit_json(..., ansible_facts={"NAME": ...})
FACTS = sorted(
    {
        name
        for path in (ROOT / "plugins" / "modules").glob("*.py")
        for name in re.findall(r"ansible_facts=\{\s*[\"'](\w+)[\"']", path.read_text())
    }
)


def _examples(path):
    """(first line number, text) of a module's or a filter sidecar's EXAMPLES, read as the other tests read
    them: a module's EXAMPLES assignment through ast (tests/integration/test_module_examples_live.py), a
    sidecar as YAML (tests/unit/test_docs.py); here with the line the text starts on."""
    text = path.read_text()
    if path.suffix == ".py":
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXAMPLES":
                return node.value.lineno, node.value.value
        return None
    for key, value in yaml.compose(text).value:
        if key.value == "EXAMPLES":
            return value.start_mark.line + 2, value.value  # the block scalar starts below its "|"
    return None


def _templated():
    """(path, first line number, text) of what Ansible templates: tasks, vars, playbooks, inventories and
    templates whole (comments blanked), the modules' and the filters' EXAMPLES."""
    for pattern in ("roles/**/*.yml", "roles/**/*.j2", "playbooks/**/*.yml", "site.yml", "molecule/**/*.yml",
                    "inventories/**/*.yml", "lab/*.yml"):  # fmt: skip
        for path in ROOT.glob(pattern):
            yield path, 1, re.sub(r"(^|\s)#.*$", "", path.read_text(), flags=re.M)
    for path in [*(ROOT / "plugins" / "modules").glob("*.py"), *(ROOT / "plugins" / "filter").glob("*.yml")]:
        found = _examples(path)
        if found:
            yield (path, *found)


def _bare(text, fact, first=1):
    """(line number, line) of each place TEXT names FACT as a variable of its own: not as ansible_facts.FACT,
    ansible_facts['FACT'] or a result's .FACT, not as a YAML key (FACT:)."""
    bare = re.compile(r"(?<![\w.'\"\[])%s\b(?!\s*:)" % re.escape(fact))
    lines = text.splitlines()
    found = []
    for match in bare.finditer(text):
        number = text.count("\n", 0, match.start())
        found.append((first + number, lines[number].strip()))
    return found


def test_the_modules_set_facts():
    # the list is read from the modules: an empty one would make the next test pass on anything
    assert "uma_node" in FACTS and "uma_rdma" in FACTS, FACTS


def test_no_file_reads_a_collection_fact_as_an_injected_variable():
    offenders = [
        "%s:%d: %s (read ansible_facts.%s)" % (path.relative_to(ROOT), number, line, fact)
        for path, first, text in _templated()
        for fact in FACTS
        for number, line in _bare(text, fact, first)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_check_finds_a_bare_fact():
    assert _bare("    msg: '{{ uma_node.reason }}'", "uma_node") == [(1, "msg: '{{ uma_node.reason }}'")]
    assert _bare("  when: uma_rdma.present", "uma_rdma") == [(1, "when: uma_rdma.present")]
    assert _bare("    that: uma_node.unified_memory", "uma_node")
    assert not _bare("    msg: '{{ ansible_facts.uma_node.reason }}'", "uma_node")
    assert not _bare("    msg: \"{{ ansible_facts['uma_node'].reason }}\"", "uma_node")
    assert not _bare("    uma_node:", "uma_node")  # RETURN's key
    assert _bare("that:\n  - uma_node.unified_memory\n", "uma_node") == [(2, "- uma_node.unified_memory")]
    folded = "msg: >-\n  {{ inventory_hostname\n     ~ uma_rdma.summary }}"  # one expression over two lines
    assert _bare(folded, "uma_rdma", 10) == [(12, "~ uma_rdma.summary }}")]
    assert not _bare("    facts: '{{ (result.ansible_facts | default({})).uma_rdma }}'", "uma_rdma")
    assert not _bare("uma_node_baseline_gib: 0.15", "uma_node")


def test_every_kind_of_file_is_read():
    kinds = {path.relative_to(ROOT).parts[0] for path, _first, _text in _templated()}
    assert {"roles", "playbooks", "molecule", "inventories", "lab", "plugins", "site.yml"} <= kinds, kinds
    examples = {path.name: text for path, _first, text in _templated() if path.parts[-2] in ("modules", "filter")}
    assert {"node_facts.py", "rdma_facts.py", "vllm_service_rdma_links.yml"} <= set(examples), sorted(examples)
    assert all("ansible_facts.uma_" in examples[name] for name in ("node_facts.py", "rdma_facts.py"))
    # the line numbers point into the file: rdma_facts' "Say what was found" is where its EXAMPLES say
    first, text = _examples(ROOT / "plugins" / "modules" / "rdma_facts.py")
    lines = (ROOT / "plugins" / "modules" / "rdma_facts.py").read_text().splitlines()
    offset = text.splitlines().index("- name: Say what was found")
    assert lines[first - 1 + offset] == "- name: Say what was found"
    first, text = _examples(ROOT / "plugins" / "filter" / "vllm_service_rdma_links.yml")
    lines = (ROOT / "plugins" / "filter" / "vllm_service_rdma_links.yml").read_text().splitlines()
    assert lines[first - 1].strip() == text.splitlines()[0].strip()
