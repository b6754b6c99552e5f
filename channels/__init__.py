"""Channel adapters: each turns one platform's events into `ChannelMessage`s and renders replies.

Channels import from core only its shared types (`core.channel`, `core.errors`): what a channel
hands the core and what the core needs from a channel.
"""
