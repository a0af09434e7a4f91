"""The node package ships whole, by one list, and stays a package of its own.

On the node the programs run with the node's python3 and no Ansible, from
``<lib_dir>/uma_vllm_node/`` and one entry script per program (``plumbing/node_install.py``).
A module missing from ``NODE_MODULES`` is an ImportError on the node that no controller-side
test would see; an absolute import (``ansible_collections...``) or a relative one that leaves
the package works here and fails there. These tests read the package's files as text (ast),
so they see what the node will see.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import node_helpers
import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils import node as node_package
from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
NODE_DIR = os.path.join(ROOT, "plugins", "module_utils", "node")


def package_files() -> list:
    """Every .py file of the node package, as paths relative to it (``guard/program.py``)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(NODE_DIR):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        found.extend(os.path.relpath(os.path.join(dirpath, f), NODE_DIR) for f in filenames if f.endswith(".py"))
    return sorted(found)


def module_of(rel: str) -> list:
    """``guard/program.py`` -> ['guard', 'program']; ``guard/__init__.py`` -> ['guard']."""
    parts = rel[: -len(".py")].split(os.sep)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports_of(rel: str):
    """(level, absolute name inside the package or None, the ast node) of every import in ``rel``."""
    with open(os.path.join(NODE_DIR, rel), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    package = module_of(rel) if rel.endswith("__init__.py") else module_of(rel)[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level - 1 > len(package):
                yield node.level, None, node
                continue
            base = package[: len(package) - (node.level - 1)]
            target = [*base, *(node.module.split(".") if node.module else [])]
            yield node.level, target, node
        elif isinstance(node, ast.ImportFrom):
            yield 0, node.module, node
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name, node


def test_node_modules_is_every_file_of_the_package_once():
    listed = [node_install.relative_path(mod)[len(node_install.PACKAGE_DIR) + 1 :] for mod in node_install.NODE_MODULES]
    assert len(listed) == len(set(listed))
    on_disk = [path.replace(os.sep, "/") for path in package_files()]
    assert sorted(listed) == on_disk, "plugins/module_utils/plumbing/node_install.py NODE_MODULES: %s" % sorted(
        set(listed) ^ set(on_disk)
    )


@pytest.mark.parametrize("rel", package_files())
def test_the_package_imports_only_itself_and_the_stdlib(rel):
    """Relative imports that stay inside the package, or the standard library: never Ansible or the controller."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for level, target, node in imports_of(rel):
        where = "%s line %d" % (rel, node.lineno)
        if level:
            assert target is not None, "%s: a relative import that leaves the node package" % where
            path = os.path.join(NODE_DIR, *target)
            names = [alias.name for alias in node.names]
            found = os.path.isdir(path) or os.path.isfile(path + ".py")
            assert found, "%s: %s is not in the node package" % (where, ".".join(target))
            if os.path.isdir(path) and not node.module:
                for name in names:  # from . import x: x is a module of the package
                    assert os.path.isfile(os.path.join(path, name + ".py")), "%s: %s" % (where, name)
        else:
            top = target.split(".")[0]
            optional = top == "psutil"  # optional on a node (the guard's watcher falls back)
            assert top in stdlib or optional, "%s imports %s: the node has only the standard library" % (where, target)


@pytest.mark.parametrize("rel", package_files())
def test_no_program_imports_another_program(rel):
    """A program (``<part>/program.py``) is imported by its entry script alone; shared pieces live in base."""
    for level, target, node in imports_of(rel):
        if not level or target is None:
            continue
        names = [alias.name for alias in node.names] if not node.module else []
        assert target[-1:] != ["program"] and "program" not in names, "%s line %d imports a program" % (
            rel,
            node.lineno,
        )


def test_entry_scripts_call_main_of_a_listed_module():
    listed = {node_install.relative_name(mod): mod for mod in node_install.NODE_MODULES}
    for name, module, _what in node_package.ENTRY_SCRIPTS:
        assert module in listed and callable(listed[module].main), name
    names = [name for name, _module, _what in node_package.ENTRY_SCRIPTS]
    assert len(names) == len(set(names)) and all(n.startswith("uma_") and n.endswith(".py") for n in names)


def role_program_list(role: str, var: str):
    with open(os.path.join(ROOT, "roles", role, "vars", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle).get(var)


def test_the_launch_wrapper_roles_list_is_what_node_files_installs():
    """node_files installs the package and the entry scripts; state=absent removes __launch_wrapper_programs."""
    programs = role_program_list("launch_wrapper", "__launch_wrapper_programs")
    shipped = [node_install.PACKAGE_DIR] + [name for name, _module, _what in node_package.ENTRY_SCRIPTS]
    assert programs == shipped, "roles/launch_wrapper/vars/main.yml __launch_wrapper_programs: write it as %s" % shipped


def test_launch_wrapper_keeps_the_readahead_restorer_and_its_package():
    kept = role_program_list("launch_wrapper", "__launch_wrapper_readahead_programs")
    assert kept == [node_install.PACKAGE_DIR, "uma_readahead.py"]
    assert ("uma_readahead.py", "base.blockdev") in [(n, m) for n, m, _w in node_package.ENTRY_SCRIPTS]


def test_the_fingerprint_is_over_everything_that_ships():
    files = node_install.plan_node_files("/nonexistent/lib")
    assert [f.name for f in files] == [name for name, _text in node_install.node_sources()]
    assert node_install.programs_fingerprint() == node_install.files_fingerprint(files)


@pytest.mark.parametrize("name", [name for name, _module, _what in node_package.ENTRY_SCRIPTS])
def test_every_entry_script_runs_from_an_installed_lib_on_a_bare_python(name):
    """The real installer's output, run as a unit runs it: ``python3 -S -E lib/uma_X.py --help``."""
    proc = subprocess.run(
        [node_helpers.NODE_PYTHON, "-S", "-E", os.path.join(node_helpers.NODE_LIB, name), "--help"],
        capture_output=True, text=True, timeout=60, cwd="/", check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr


def test_a_module_left_out_of_the_list_fails_on_the_node(tmp_path):
    """Why the list matters: the installed package without one module is an ImportError there."""
    lib = node_helpers.flat_copy(tmp_path)
    os.remove(os.path.join(str(lib), node_install.PACKAGE_DIR, "guard", "residency.py"))
    proc = subprocess.run(
        [node_helpers.NODE_PYTHON, "-S", str(lib / "uma_launch.py"), "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "residency" in proc.stderr
