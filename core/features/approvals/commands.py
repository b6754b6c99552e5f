"""`/approve ID [here]`, `/edit ID CHANGE` and `/deny ID`: a person's answer to a question.

The buttons under a question are these same commands (a press is delivered as its command), so
typing and pressing answer alike; `Approvals.answer` decides who may answer and what it means.
"""

from core.channel import Channel, ChannelMessage
from core.features.approvals.questions import Approvals
from core.text import Command

USAGE = {"approve": " [here]", "edit": " WHAT TO CHANGE"}


class AnswerCommand:
    """The `/approve`, `/edit` and `/deny` handler of a dispatcher."""

    def __init__(self, approvals: Approvals) -> None:
        self._approvals = approvals

    async def __call__(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        key, _, rest = command.argument.strip().removeprefix("#").partition(" ")
        rest = rest.strip()
        if not key.isdigit() or (command.name != "edit" and rest not in ("", "here")):
            answer = f"Usage: /{command.name} ID" + USAGE.get(command.name, "")
        else:
            decision = {"deny": "denied", "edit": "edited"}.get(command.name, "allowed")
            if decision == "allowed" and rest == "here":
                decision = "allowed_here"
            name = message.author_name or message.author_id
            change = rest if command.name == "edit" else ""
            answer = await self._approvals.answer(
                int(key), message.author_id, name, decision, change
            )
        await channel.notify(message.place, answer)
