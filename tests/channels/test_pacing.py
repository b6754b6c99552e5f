"""Every platform's replies within its limits (`channels.budget`), run for each remote platform:
the final text never waits for the edit interval, a short reply is one message, and a burst of
chats is answered whole while the platform's fake enforces the platform's published limits.

The web chat is left out: its platform is this process's own board, with no limits to keep and
nothing to save by posting once.
"""

import pytest

from channels.settings import PlatformSettings
from tests.channels.platforms import ANN, RemotePlatform
from tests.fakes.ollama import ChunkDelay, Text

LIMITED = pytest.mark.platforms(
    "telegram", "slack", "discord", why="the web chat's board has no platform limits to keep"
)
SHIPPED = PlatformSettings()
"""The shipped `post_grace` and `edit_interval` (every platform's)."""


@LIMITED
@pytest.mark.channel(post_grace=SHIPPED.post_grace)
async def test_a_short_reply_is_one_message_not_a_post_and_an_edit(
    platform: RemotePlatform,
) -> None:
    platform.bot.ollama.script(Text("Short and sweet.", chunks=4))
    platform.say(ANN, "hello")
    await platform.wait_until(lambda: platform.shown(ANN) == ["Short and sweet."], "the reply")
    assert platform.edits_tried(ANN) == 0


@LIMITED
@pytest.mark.channel(edit_interval=3600)
async def test_the_final_text_does_not_wait_for_the_edit_interval(
    platform: RemotePlatform,
) -> None:
    """Regression (issue 36): a reply's last edit waited until `edit_interval` had passed since
    its previous change, so a person alone waited up to a second for the end of every reply.
    Here the interval is an hour: the whole reply shows long before."""
    words = "one two three four five six"
    platform.bot.ollama.script(ChunkDelay(0.02), Text(words, chunks=6))
    platform.say(ANN, "count to six")
    await platform.wait_until(lambda: platform.shown(ANN) == [words], "the whole reply")
    assert platform.edits_tried(ANN) == 1, "posted with its first words, then its final text"
