"""The web channel: a browser conversation is a place (see channel.py)."""
