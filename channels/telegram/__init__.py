"""Telegram: private chats (and, when enabled, group messages addressed to the bot).

One adapter in five modules, one concern each, so that each can be read without the others:
- `channel`: `TelegramChannel`, what the core and `bot/app.py` see: starting (`kaiwa check`'s
  `problems`, logging in), polling or taking webhook posts, confirming updates, stopping, and
  opening replies and notices;
- `receiving`: an update as a `ChannelMessage` (which messages are for the bot, their keys);
- `files`: what a message's files are (voice notes, audio, documents, pictures) and fetching
  them by file id, within Telegram's 20 MB and the core's limit (`Files.download`);
- `interactions`: a button press as its command from the presser, answered to them alone;
- `transport`: `TelegramTransport`, how a reply shows (HTML, buttons), and Telegram's errors
  mapped to Kaiwa's.

This file imports nothing, so python-telegram-bot is loaded only when `bot/app.py` builds the
channel (`channels.telegram.channel`), which it does only when Telegram is configured.
"""
