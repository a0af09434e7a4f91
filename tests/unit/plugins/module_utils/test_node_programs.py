"""The node-side programs ship with every file they import.

On the node the programs run from one directory with the node's python3 and no Ansible, so
each import falls back to a plain sibling module (``from _common import ...``). A sibling
missing from the list a role copies, or from the modules a module installs through
_nodefiles, is an ImportError on the node that no controller-side test would see.
"""

from __future__ import annotations

import ast
import os

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils import _guard_service, _node_programs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")


def sibling_imports(name: str) -> set:
    """Module names (files in module_utils) that ``name`` imports in its node-side fallback."""
    with open(os.path.join(MODULE_UTILS, name), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for module in names:
            if os.path.exists(os.path.join(MODULE_UTILS, module + ".py")):
                found.add(module + ".py")
    return found


def closure(start: str) -> set:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(sibling_imports(name) - seen)
    return seen


def role_programs(role: str, var: str) -> set:
    with open(os.path.join(ROOT, "roles", role, "vars", "main.yml"), encoding="utf-8") as handle:
        return set(yaml.safe_load(handle)[var])


def role_program_list(role: str, var: str):
    """The role's list as written, or None once the role installs through uma.vllm.node_files."""
    with open(os.path.join(ROOT, "roles", role, "vars", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle).get(var)


def test_the_closure_finds_the_guards_parts():
    assert {"uma_guard.py", "_common.py", "_guard_config.py", "_guard_sweeper.py", "_guard_residency.py"} <= closure(
        "uma_guard.py"
    )


NODE_PROGRAM_CLOSURE = closure("uma_launch.py") | closure("uma_guard.py") | closure("uma_watchdog.py")


@pytest.mark.parametrize("program", ["uma_launch.py", "uma_guard.py"])
def test_launch_wrapper_ships_everything_its_programs_import(program):
    programs = role_program_list("launch_wrapper", "__launch_wrapper_programs")
    if programs is None:  # the role installs through node_files: NODE_PROGRAMS is checked below
        programs = _node_programs.program_names()
    missing = closure(program) - set(programs)
    assert not missing, "roles/launch_wrapper/vars/main.yml __launch_wrapper_programs lacks %s" % sorted(missing)


def test_node_programs_is_the_import_closure_of_the_three_programs():
    """uma.vllm.node_files (programs: true) installs exactly this set: nothing missing, nothing extra."""
    names = _node_programs.program_names()
    assert len(names) == len(set(names))
    assert set(names) == NODE_PROGRAM_CLOSURE, "plugins/module_utils/_node_programs.py NODE_PROGRAMS: %s" % sorted(
        set(names) ^ NODE_PROGRAM_CLOSURE
    )


def test_the_roles_list_if_present_is_node_programs():
    """Until the role switches to node_files and drops its list, both say the same, in the same order."""
    programs = role_program_list("launch_wrapper", "__launch_wrapper_programs")
    if programs is not None:
        assert programs == _node_programs.program_names()


def test_drop_cache_loop_installs_everything_the_guard_imports():
    installed = {module.__name__.rpartition(".")[2] + ".py" for module in _guard_service.NODE_PROGRAM}
    assert closure("uma_guard.py") == installed


def test_monitoring_ships_everything_its_collector_imports():
    programs = role_programs("monitoring", "__monitoring_programs")
    for program in programs:
        missing = closure(program) - programs
        assert not missing, "roles/monitoring/vars/main.yml __monitoring_programs lacks %s" % sorted(missing)


def test_the_alerts_scenario_installs_everything_the_watchdog_imports():
    """molecule/monitoring_alerts copies the watchdog by hand: its list follows the imports too."""
    with open(os.path.join(ROOT, "molecule", "monitoring_alerts", "prepare.yml"), encoding="utf-8") as handle:
        plays = yaml.safe_load(handle)
    lists = [
        task["loop"]
        for play in plays
        for task in play.get("tasks", [])
        if "uma_watchdog.py" in (task.get("loop") or [])
    ]
    assert len(lists) == 1, "the task that installs uma_watchdog.py was not found"
    missing = closure("uma_watchdog.py") - set(lists[0])
    assert not missing, "molecule/monitoring_alerts/prepare.yml lacks %s" % sorted(missing)


def test_readahead_window_installs_everything_its_restorer_imports():
    from ansible_collections.uma.vllm.plugins.module_utils import _readahead

    installed = {module.__name__.rpartition(".")[2] + ".py" for module in _readahead.NODE_FILES}
    assert closure("_blockdev.py") == installed
