"""The composition root: CLI, configuration, wiring, start-up checks and shutdown."""
