"""Slack: a conversation is a thread.

One adapter, its main modules one concern each, so that each can be read without the others:
- `channel`: `SlackChannel` (and `SlackTokens`), what the core and `bot/app.py` see: starting
  (`kaiwa check`'s `problems`, who the bot is, the Socket Mode URL), receiving over Socket Mode
  or HTTP, stopping, and opening replies and notices;
- `socket_mode`: slack_sdk's Socket Mode client and bolt's handler, made to report to the
  channel;
- `receiving`: a message event as a `ChannelMessage` (which messages are for the bot, in which
  thread);
- `files`: the files of a message as attachments (pictures fetched), and their download with
  the bot token;
- `interactions`: the `/kaiwa` slash command and button presses as commands from the person who
  used them, a press answered to them alone;
- `transport`: `SlackTransport`, how a reply shows (mrkdwn, Block Kit buttons, the working
  reaction), and Slack's errors mapped to Kaiwa's.

This file imports nothing, so slack_bolt and slack_sdk are loaded only when `bot/app.py` builds
the channel (`channels.slack.channel`), which it does only when Slack is configured.
"""
