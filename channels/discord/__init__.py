"""Discord: a conversation is a thread.

One adapter in seven modules, one concern each, so that each can be read without the others:
- `channel`: `DiscordChannel`, what the core and `bot/app.py` see: logging in (and `kaiwa
  check`'s `problems`), registering the slash commands, running the gateway, handing its events
  over, stopping, and opening replies and notices;
- `client`: discord.py's client, its gateway events reported to the channel, its parsers
  contained, and the buttons whose clicks it routes back;
- `receiving`: a message as a `ChannelMessage` (which messages are for the bot, and the thread
  each belongs to, opened on a mention when first used);
- `files`: a message's files, its pictures read and the others described, and those fetched from
  Discord's CDN when the core asks (`Files.download`);
- `interactions`: slash commands and button clicks as commands from the person who used them,
  answered to them alone;
- `transport`: `DiscordTransport`, how a reply shows (2,000 characters a message, buttons), and
  Discord's errors mapped to Kaiwa's;
- `library`: discord.py itself, imported once for all of them, quietly.

This file imports nothing, so discord.py is loaded only when `bot/app.py` builds the channel
(`channels.discord.channel`), which it does only when Discord is configured.
"""
