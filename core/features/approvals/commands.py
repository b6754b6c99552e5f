"""`/approve ID [here]`, `/edit ID CHANGE` and `/deny ID`: a person's answer to a question; and
`/grants [revoke TOOL|all]`: the tools allowed here without asking.

The buttons under a question are these same commands (a press is delivered as its command), so
typing and pressing answer alike; `Approvals.answer` decides who may answer and what it means.
Anyone in the conversation may list or revoke its grants: revoking only makes Kaiwa ask again.
"""

from core.channel import Channel, ChannelMessage
from core.features.approvals.questions import Approvals
from core.store import Store
from core.text import Command, plural

GRANTS_USAGE = "Usage: /grants, /grants revoke TOOL, or /grants revoke all."

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


class GrantsCommand:
    """`/grants`: the tools this conversation lets run without asking, and their revocation."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def __call__(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        verb, _, tool = command.argument.strip().partition(" ")
        tool = tool.strip()
        if not verb:
            answer = await self._listed(message.place)
        elif verb == "revoke" and tool:
            answer = await self._revoked(message.place, tool)
        else:
            answer = GRANTS_USAGE
        await channel.notify(message.place, answer)

    async def _listed(self, place: str) -> str:
        grants = await self._store.grants(place)
        if not grants:
            return "No tool runs here without asking (a question's Allow here adds one)."
        lines = [
            f"- {grant.tool}: allowed by {grant.granted_by}, {grant.created_at:%Y-%m-%d %H:%M} UTC"
            for grant in grants
        ]
        return "\n".join(
            ["These tools run here without asking:", *lines, "/grants revoke TOOL asks again."]
        )

    async def _revoked(self, place: str, tool: str) -> str:
        if tool == "all":
            count = await self._store.revoke_grants(place)
            if not count:
                return "Nothing to revoke: no tool runs here without asking."
            return f"Revoked {count} {plural(count, 'grant')}: every tool asks again here."
        if await self._store.revoke_grants(place, tool):
            return f"{tool} asks again here before it runs."
        return f"{tool} was not allowed here without asking; /grants lists what is."
