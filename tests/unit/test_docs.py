"""The user-facing docs stay usable: the README opens with the two commands, refers to nothing
outside the repository, its local links resolve, and every filter has its sidecar doc."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.rst"))]
# things that exist only beside a checkout, on the machine that wrote it, or in a tracker
OUTSIDE = re.compile(r"\.\./shared|LAB-NOTES|issue \d+ notes|\(stop \d+\)|/work/|/tmp/i\d+")


def test_readme_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block and text.index(block.group(0)) < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["bash lab/up.sh", "bash tests/all.sh"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_outside_the_repository(path):
    hits = [m.group(0) for m in OUTSIDE.finditer(path.read_text(encoding="utf-8"))]
    assert hits == []


@pytest.mark.parametrize("path", [p for p in DOCS if p.suffix == ".md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        if not (path.parent / target).exists():
            missing.append(target)
    assert missing == []


def _filters():
    names = []
    for path in sorted((ROOT / "plugins" / "filter").glob("*.py")):  # every filter plugin file, not a list
        module = importlib.import_module("ansible_collections.uma.vllm.plugins.filter." + path.stem)
        names.extend(module.FilterModule().filters())
    return sorted(names)


@pytest.mark.parametrize("name", _filters())
def test_every_filter_has_its_sidecar_doc(name):
    doc = yaml.safe_load((ROOT / "plugins" / "filter" / ("%s.yml" % name)).read_text(encoding="utf-8"))
    assert doc["DOCUMENTATION"]["name"] == name
    assert doc["DOCUMENTATION"]["options"]["_input"]["description"]
    assert "_value" in doc["RETURN"] and "uma.vllm.%s" % name in doc["EXAMPLES"]


def test_no_sidecar_without_a_filter():
    sidecars = sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.yml"))
    assert sidecars == _filters()


MODULE_UTILS = ROOT / "plugins" / "module_utils"


@pytest.mark.parametrize(
    "name",
    sorted(
        str(p.relative_to(MODULE_UTILS))
        for p in MODULE_UTILS.rglob("*.py")
        if "__pycache__" not in p.parts and (p.name != "__init__.py" or p.parent.name == "node")
    ),
)
def test_the_architecture_page_names_every_module_utils_file(name):
    """docs/ARCHITECTURE.md is the map of the house: a file it does not name is a room nobody can find."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert "`%s`" % name in text, "docs/ARCHITECTURE.md does not name plugins/module_utils/%s" % name


def test_module_utils_has_no_flat_files_and_no_import_fallback():
    """Every module_utils file lives in a package of its domain, imported one way."""
    assert sorted(p.name for p in MODULE_UTILS.glob("*.py")) == []
    fallbacks = [
        str(p.relative_to(ROOT))
        for p in MODULE_UTILS.rglob("*.py")
        if re.search(r"except ImportError:.*\n\s+(from _|import _)", p.read_text(encoding="utf-8"))
    ]
    assert fallbacks == []
