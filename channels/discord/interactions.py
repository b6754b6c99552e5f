"""Discord's slash commands and button clicks, delivered as commands from the person who used them.

Commands come typed (`/stop`, `!stop`, or a mention followed by the bare word: messages,
`channels.discord.receiving`), as slash commands registered at start-up (`command_tree`), which
act on the thread they are used in, and as the Stop button a reply carries while it streams
(`channels.discord.client.CommandButton`). Slash commands and the button are answered privately
to the person who used them (an ephemeral interaction response), since the reply itself shows
the outcome to everyone. Interactions are deduplicated by their own ids.

A slash command's or click's answer is routed to its user by `channels.presses`, only while that
interaction's own command runs in the dispatcher (`deliver_interaction`), so a notice for
another message in the same thread cannot take it
(test_a_private_answer_and_a_public_one_in_one_thread_do_not_swap).
"""

import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence

from channels.discord.library import app_commands, discord
from channels.discord.receiving import origin_of
from channels.discord.transport import MESSAGE_LIMIT, view
from channels.formatting import split_message
from channels.places import DiscordPlace
from channels.presses import Press, pressing
from core.channel import COMMANDS, Button, ChannelMessage, Deliver

COMMANDS_WITH_WORDS = {
    "agents": "a name or id; stop NAME; tell NAME MESSAGE",
    "tasks": "pause|resume|cancel|run ID",
    "memory": "forget ID",
    "plan": "the task to plan and carry out",
    "approve": "ID, or ID here",
    "edit": "ID, then what to change",
    "deny": "ID",
    "grants": "revoke TOOL, or revoke all",
}
"""Slash commands that take what follows them (as typed after `!agents`), and its description."""
THREAD_TYPES = (
    discord.ChannelType.public_thread,
    discord.ChannelType.private_thread,
    discord.ChannelType.news_thread,
)

RunSlashCommand = Callable[[discord.Interaction, str], Awaitable[None]]
"""What runs a slash command used where it can act: given the interaction and its command."""


def command_tree(client: discord.Client, used: RunSlashCommand) -> app_commands.CommandTree:
    """Every command as a slash command of `client`'s, each handed to `used`."""
    commands = app_commands.CommandTree(client)
    for name, summary in COMMANDS:
        commands.add_command(_slash_command(name, summary, used))
    return commands


def _slash_command(name: str, summary: str, used: RunSlashCommand) -> app_commands.Command:
    async def run_command(interaction: discord.Interaction, what: str = "") -> None:
        if _place_of(interaction) is None:
            await interaction.response.send_message(
                "Kaiwa's conversations live in threads: mention me in a channel to open "
                f"one, then use /{name} inside it.",
                ephemeral=True,
            )
            return
        await used(interaction, f"/{name} {what}".strip())

    if name in COMMANDS_WITH_WORDS:
        described = app_commands.describe(what=COMMANDS_WITH_WORDS[name])(run_command)
        return app_commands.Command(name=name, description=summary, callback=described)

    async def bare(interaction: discord.Interaction) -> None:
        await run_command(interaction)

    return app_commands.Command(name=name, description=summary, callback=bare)


async def deliver_interaction(
    interaction: discord.Interaction, text: str, deliver: Deliver | None
) -> None:
    """Deliver a slash command or click as a typed command (to `deliver`, unless the channel
    no longer receives); its answer (or, if there is none, nothing: the "thinking…" goes away)
    is the interaction's response."""
    answer = functools.partial(_answer_privately, interaction)
    press = Press(_place_of(interaction) or "", answer)
    origin = origin_of(interaction.user, interaction.channel, interaction.guild_id)
    with pressing(press):
        if deliver and press.place:
            await deliver(
                ChannelMessage(
                    platform=DiscordPlace.platform,
                    place=press.place,
                    message_id=f"interaction:{interaction.id}",
                    author_id=str(interaction.user.id),
                    author_name=interaction.user.display_name,
                    text=text,
                    room=origin.room,
                    space=origin.space,
                    author_roles=origin.roles,
                )
            )
    if not press.answered and interaction.type is discord.InteractionType.application_command:
        with contextlib.suppress(discord.HTTPException):
            await interaction.delete_original_response()


def _place_of(interaction: discord.Interaction) -> str | None:
    """Where a slash command or button acts: the thread or DM it was used in."""
    if interaction.guild_id is None:
        return DiscordPlace.direct(interaction.channel_id or 0).key
    channel = interaction.channel
    is_thread = isinstance(channel, discord.Thread) or (
        isinstance(channel, discord.PartialMessageable) and channel.type in THREAD_TYPES
    )
    if not (is_thread and channel):
        return None
    return DiscordPlace(str(interaction.guild_id), channel.id).key


async def _answer_privately(
    interaction: discord.Interaction, text: str, buttons: Sequence[Button]
) -> None:
    """A command's answer to the person who used a slash command (its deferred response) or
    clicked a button (a private follow-up), `buttons` under its last piece."""
    pieces = split_message(text, MESSAGE_LIMIT, len)
    views = [None] * (len(pieces) - 1) + [view(buttons)]
    if interaction.type is discord.InteractionType.application_command:
        await interaction.edit_original_response(content=pieces.pop(0), view=views.pop(0))
    for piece, its_view in zip(pieces, views, strict=True):
        await interaction.followup.send(
            piece, ephemeral=True, view=its_view or discord.utils.MISSING
        )
