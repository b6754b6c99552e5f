"""The model-facing history: whatever the store holds after a crash, the request is well-formed."""

from datetime import UTC, datetime
from typing import Any

from core.store.history import CUT_OFF, SHUTDOWN, ending_of, history_wire, unanswered_calls
from core.store.tables import Message

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def message(role: str, text: str = "", turn: int = 1, **fields: Any) -> Message:
    return Message(
        conversation_id=1,
        turn_id=turn,
        role=role,
        text=text,
        created_at=NOW,
        updated_at=NOW,
        **fields,
    )


def call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": {}}


def test_a_tool_call_without_a_result_gets_one_in_the_order_asked() -> None:
    """Regression: after kill -9 between a tool call's record and its result's, the next
    request sent the call with no result, which a model refuses or misreads."""
    rows = [
        message("user", "look both up"),
        message("assistant", tool_calls=[call("c1", "search"), call("c2", "fetch")]),
        message("tool", "fetched", tool_name="fetch", tool_call_id="c2"),
        message("user", "and?", turn=2),
    ]

    wire = history_wire(rows, {1: "interrupted"})

    assert [(m["role"], m.get("tool_name")) for m in wire] == [
        ("user", None),
        ("assistant", None),
        ("tool", "search"),
        ("tool", "fetch"),
        ("user", None),
    ]
    assert wire[2]["content"].startswith("Kaiwa restarted while 'search' was running")
    assert wire[3]["content"] == "fetched"


def test_calls_left_at_the_very_end_get_results_too() -> None:
    rows = [message("user", "go"), message("assistant", tool_calls=[call("c1", "search")])]
    assert [m["role"] for m in history_wire(rows)] == ["user", "assistant", "tool"]
    assert unanswered_calls(rows) == [call("c1", "search")]


def test_a_reply_cut_by_a_shutdown_does_not_read_as_stopped_by_the_person() -> None:
    """Regression (issue 33): a reply stopped by SIGTERM is stored `stopped` like one the person
    stopped, so the next request told the model that the person had stopped it."""
    rows = [
        message("assistant", "Shut down mid", turn=1, partial=True, stopped=True),
        message("assistant", "Stopped mid", turn=2, partial=True, stopped=True),
    ]
    endings = {1: ending_of("stopped", SHUTDOWN), 2: ending_of("stopped", "user")}

    wire = history_wire(rows, endings)

    assert [m["content"] for m in wire] == [
        f"Shut down mid\n\n{CUT_OFF[SHUTDOWN]}",
        f"Stopped mid\n\n{CUT_OFF['stopped']}",
    ]
    assert "nobody asked to stop this reply" in CUT_OFF[SHUTDOWN]


def test_a_cut_off_reply_says_how_it_was_cut() -> None:
    """Regression: a partial reply went back to the model as if it were complete."""
    rows = [
        message("assistant", "Stopped mid", turn=1, partial=True, stopped=True),
        message("assistant", "Failed mid", turn=2, partial=True),
        message("assistant", "Crashed mid", turn=3, partial=True),
        message("assistant", "Complete.", turn=4),
    ]

    wire = history_wire(rows, {1: "stopped", 2: "failed", 3: "running", 4: "done"})

    assert [m["content"] for m in wire] == [
        f"Stopped mid\n\n{CUT_OFF['stopped']}",
        f"Failed mid\n\n{CUT_OFF['failed']}",
        f"Crashed mid\n\n{CUT_OFF['interrupted']}",
        "Complete.",
    ]


def test_a_cut_off_reply_with_no_text_is_only_its_marker() -> None:
    rows = [message("assistant", "", partial=True, stopped=True)]
    assert history_wire(rows)[0]["content"] == CUT_OFF["stopped"]
