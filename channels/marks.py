"""The words a reply shows besides the model's once it ends: "(stopped)", "(interrupted by a
restart)", a note such as "answered at the limit of 10 model calls", or a failure's reason.

One owner for every surface: the platforms' replies (`channels.rendering`), the web chat, and
the terminal, which prints the mark after the streamed text.
"""

from core.channel import Outcome

MARKS = {
    Outcome.STOPPED: "(stopped)",
    Outcome.INTERRUPTED: "(interrupted by a restart)",
    Outcome.CUT: "(cut at the length limit)",
}
"""How a reply that did not end as the model meant shows it, after its text."""


def ending_mark(outcome: Outcome, note: str | None) -> str | None:
    """The mark after a reply's text: the outcome's, with the note of a reply that did not fail
    ("answered at the limit of 10 model calls"); None for a plain answer. A failure shows its
    reason instead, on a line of its own."""
    if outcome is Outcome.FAILED:
        return None
    parts = [MARKS[outcome][1:-1]] if outcome in MARKS else []
    parts += [note] if note else []
    return f"({'; '.join(parts)})" if parts else None


def final_text(text: str, outcome: Outcome, note: str | None) -> str:
    """The reply's last form: the answer, then the stop mark or the failure reason."""
    mark = ending_mark(outcome, note)
    if mark:
        return _marked(text, mark)
    if outcome is Outcome.FAILED:
        reason = f"⚠️ {note}" if note else "⚠️ the reply failed"
        return f"{text}\n\n{reason}" if text else reason
    return text


def _marked(text: str, mark: str) -> str:
    """The text, then one space and the mark (however the text ended)."""
    text = text.rstrip()
    return f"{text} {mark}" if text else mark
