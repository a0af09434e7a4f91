"""The shared before/after tracker (module_utils/plumbing/diff.py)."""

from __future__ import annotations

from ansible_collections.uma.vllm.plugins.module_utils.plumbing.diff import DifferenceTracker, as_text


def test_changed_only_when_an_entry_differs():
    same = DifferenceTracker().add("a", 1, 1).add("b", {"x": 1}, {"x": 1})
    assert not same.changed and same.changed_names() == []
    moved = DifferenceTracker().add("a", 1, 1).add("b", None, "text\n")
    assert moved.changed and moved.changed_names() == ["b"]
    assert moved.differs("b") and not moved.differs("a") and not moved.differs("absent")


def test_two_shapes_of_the_same_entries():
    t = DifferenceTracker().add("active", False, True).add("config", None, {"mode": "files"})
    assert t.before_after() == {
        "before": {"active": False, "config": None},
        "after": {"active": True, "config": {"mode": "files"}},
    }
    assert t.text_diffs() == [
        {"before_header": "active", "after_header": "active", "before": "false\n", "after": "true\n"},
        {"before_header": "config", "after_header": "config", "before": "", "after": '{\n  "mode": "files"\n}\n'},
    ]


def test_merge_keeps_the_order_and_render_is_the_callers():
    t = DifferenceTracker().add("one", "a\n", "b\n").merge(DifferenceTracker().add("two", 1, 2))
    assert [d["before_header"] for d in t.text_diffs(render=lambda v: "<%s>" % v)] == ["one", "two"]
    assert t.text_diffs(render=lambda v: "<%s>" % v)[1] == {
        "before_header": "two",
        "after_header": "two",
        "before": "<1>",
        "after": "<2>",
    }


def test_as_text():
    assert as_text(None) == "" and as_text("x\n") == "x\n" and as_text([1]) == "[\n  1\n]\n"
