"""Pure session rules: ids and slugs (hostile descriptions too), previews, compaction
cuts, and the export file's name and validation."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextlog.producers.context import StoredMessage, build_context
from contextlog.producers.history import SessionInfo, SessionMessage
from contextlog.schema import blocks
from contextlog.schema import events as ev
from contextlog.schema.errors import Refused
from contextlog.worker.store import archive, sessions
from contextlog.worker.store.projection import rounds
from tests.support.anthropic_rules import check_messages

AT = dt.datetime(2026, 11, 22, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-3)))


@pytest.mark.parametrize(
    ("description", "slug"),
    [
        ("Auth refactor", "auth-refactor"),
        ("  Fix   the   Login  bug ", "fix-the-login-bug"),
        ("../../etc/passwd", "etcpasswd"),
        ("'; DROP TABLE sessions; --", "drop-table-sessions"),
        ("Café crème déjà vu", "cafe-creme-deja-vu"),
        ("🚀 launch 🚀 day", "launch-day"),
        ("🚀🔥", ""),
        ("x" * 10_000, "x" * 40),
        ("a" * 39 + " b", "a" * 39),  # no trailing hyphen after the cut
        ("UPPER_case.and/slashes", "uppercaseandslashes"),
        ("tab\tand\nnewline", "tab-and-newline"),
    ],
)
def test_slug_rules(description: str, slug: str) -> None:
    assert sessions.slug(description) == slug


@given(st.text(max_size=2000))
def test_any_description_gives_a_safe_id(description: str) -> None:
    sid = sessions.session_id(AT, description, "first message", ())
    assert sessions.SESSION_ID.match(sid), sid
    assert len(sid) <= len("2026-11-23_") + sessions.MAX_SLUG
    assert archive.safe_filename(sid) == f"{sid}.json"


def test_id_uses_the_utc_date_and_a_hash_without_description() -> None:
    assert sessions.session_id(AT, "Plan", "hi", ()) == "2026-11-23_plan"  # 02:30 UTC
    assert sessions.session_id(AT, None, "hi", ()) == "2026-11-23_" + sessions.content_hash("hi")
    assert sessions.session_id(AT, "🚀", "hi", ()) == "2026-11-23_" + sessions.content_hash("hi")
    assert len(sessions.content_hash("hi")) == 6


def test_collisions_get_numbered_suffixes() -> None:
    taken = {"2026-11-23_plan", "2026-11-23_plan-2"}
    assert sessions.session_id(AT, "plan", "x", taken) == "2026-11-23_plan-3"
    assert sessions.unique("a", set()) == "a"


def test_preview_is_one_line_of_at_most_80_characters() -> None:
    assert sessions.preview("hello\n  world") == "hello world"
    long = sessions.preview("word " * 100)
    assert len(long) == 80 and long.endswith("…")


def test_text_of_reads_blocks() -> None:
    content = [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "4C"}]},
        {"type": "text", "text": "and sunny"},
    ]
    assert blocks.text_of(content) == "4C and sunny"


def msg(seq: int, role: str, content: object, tokens: int = 10) -> StoredMessage:
    return StoredMessage(seq, role, content, tokens)  # type: ignore[arg-type]


def test_a_restore_brings_back_the_newest_exchanges_that_fit() -> None:
    window = [
        msg(1, "user", "q1", 100),
        msg(2, "assistant", "a1", 100),
        msg(3, "user", "q2", 100),
        msg(4, "assistant", [{"type": "tool_use", "id": "t", "name": "f", "input": {}}], 10),
        msg(5, "user", [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}], 10),
        msg(6, "assistant", "a2", 100),
    ]
    assert [m.seq for m in sessions.fit_restored(window, 10**6)] == [1, 2, 3, 4, 5, 6]
    assert [m.seq for m in sessions.fit_restored(window, 300)] == [3, 4, 5, 6]
    assert [m.seq for m in sessions.fit_restored(window, 10)] == [3, 4, 5, 6]  # the newest
    # Ending inside a tool-use cycle: the cycle goes (continued after the restore it
    # would need the thinking a restore removes), its question stays.
    assert [m.seq for m in sessions.fit_restored(window[:5], 10**6)] == [1, 2, 3]
    assert [m.seq for m in sessions.fit_restored(window[:4], 10**6)] == [1, 2, 3]


@given(st.lists(st.sampled_from(["q", "a", "use", "res"]), min_size=1, max_size=30))
def test_what_a_restore_brings_back_is_a_valid_context(kinds: list[str]) -> None:
    window, tool = [], 0
    for i, k in enumerate(kinds, start=1):
        if k == "use":
            tool += 1
            window.append(
                msg(
                    i,
                    "assistant",
                    [{"type": "tool_use", "id": f"t{tool}", "name": "f", "input": {}}],
                )
            )
        elif k == "res":
            window.append(
                msg(i, "user", [{"type": "tool_result", "tool_use_id": f"t{tool}", "content": "r"}])
            )
        else:
            window.append(msg(i, "user" if k == "q" else "assistant", k))
    kept = sessions.fit_restored(window, 50)
    ctx = build_context(kept)
    assert check_messages(ctx.messages) == []
    assert kept == window[len(window) - len(kept) :] or "q" in kinds


def test_export_file_names_never_leave_the_folder(tmp_path: Path) -> None:
    for hostile in ("../../etc/passwd", "/etc/passwd", "..", "a/../../b", "\x00x"):
        path = archive.target(tmp_path, hostile)
        assert path.parent == tmp_path.resolve(), path
        assert not path.name.startswith(".")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "not a contextlog session export"),
        (b'{"session_id": "x"}', "missing required field"),
    ],
)
def test_a_bad_import_file_is_refused_with_a_reason(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(content)
    with pytest.raises(Refused, match=reason):
        archive.read(path)


def test_an_import_file_must_hold_what_it_says(tmp_path: Path) -> None:
    doc = {
        "session_id": "2026-11-22_x",
        "timestamp": "2026-11-22T10:00:00Z",
        "message_count": 2,
        "messages": [{"role": "user", "content": "hi"}],
    }
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(Refused, match="message_count is 2 but it holds 1"):
        archive.read(path)
    doc["messages"] = [{"role": "robot", "content": "hi"}] * 2
    path.write_text(json.dumps(doc))
    with pytest.raises(Refused, match=r"messages\[0\].role"):
        archive.read(path)
    with pytest.raises(Refused, match="cannot read"):
        archive.read(tmp_path / "missing.json")


def test_rounds_keep_each_conversations_order_and_end_at_its_commands() -> None:
    batch = ["a1", "b1", "A!", "a2", "b2", "B!", "A!", "b3"]  # capitals are commands
    got = list(rounds(batch, lambda e: e[0].lower(), lambda e: e.endswith("!")))
    assert got == [["a1", "A!", "b1", "b2", "B!"], ["a2", "A!", "b3"]]
    assert list(rounds([], str, bool)) == []


def test_an_export_leaves_a_failed_summary_out_and_marks_a_local_one() -> None:
    """A failed summary's placeholder is no summary: the import asks for one again."""
    info = SessionInfo(
        "2026-11-22_plan", "a", "c", AT, None, "(summary generation failed)", 1, 3, False, "hi"
    )
    message = SessionMessage(1, "", AT, 3, "user", "hi")
    failed = archive.document(replace(info, summary_failed=True), [message])
    assert (failed.summary, failed.summary_local) == (None, False)
    local = archive.document(replace(info, summary="Plans.", summary_local=True), [message])
    assert (local.summary, local.summary_local) == ("Plans.", True)
    [*_, session] = archive.events(local, "a", "dm", AT)
    assert isinstance(session, ev.SessionImported) and session.summary_local
