"""Channel adapters: each turns one platform's events into `ChannelMessage`s and renders replies."""
