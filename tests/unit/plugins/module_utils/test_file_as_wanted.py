"""service/files.py file_as_wanted: the role skips its firewall writes only where the node has exactly
what it would write (content, mode, owner), as uma.vllm.engine_facts saw it."""

from __future__ import annotations

import hashlib
import os

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.service import engine_facts as ef
from ansible_collections.uma.vllm.plugins.module_utils.service.files import file_as_wanted

RULES = "table inet uma_vllm {\n}\n"


def _seen(tmp_path, content=RULES, mode=0o644):
    path = tmp_path / "firewall.nft"
    path.write_text(content)
    os.chmod(str(path), mode)
    return ef.file_facts([str(path)])[str(path)]


def test_the_same_file_is_as_wanted(tmp_path):
    assert file_as_wanted((RULES, _seen(tmp_path)), "0644", os.getuid(), os.getgid())


@pytest.mark.parametrize(
    "content, mode, uid_delta, what",
    [
        (RULES + "# edited\n", 0o644, 0, "content"),
        (RULES, 0o666, 0, "mode"),
        (RULES, 0o644, 1, "owner"),
    ],
)
def test_any_difference_runs_the_write(tmp_path, content, mode, uid_delta, what):
    assert not file_as_wanted((RULES, _seen(tmp_path, content, mode)), "0644", os.getuid() + uid_delta, os.getgid()), (
        what
    )


def test_nothing_a_symlink_or_garbage_is_not_as_wanted(tmp_path):
    target = tmp_path / "real.nft"
    target.write_text(RULES)
    link = tmp_path / "link.nft"
    os.symlink(str(target), str(link))
    seen = ef.file_facts([str(tmp_path / "none"), str(link)])
    assert not file_as_wanted((RULES, seen[str(tmp_path / "none")]), "0644", os.getuid(), os.getgid())
    assert not file_as_wanted((RULES, seen[str(link)]), "0644", os.getuid(), os.getgid())
    assert not file_as_wanted(None, "0644", 0, 0)
    assert not file_as_wanted((RULES, {"kind": "file", "sha256": hashlib.sha256(b"x").hexdigest()}), "0644", 0, 0)
