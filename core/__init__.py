"""The turn path, the agent loop, the model client, tools, the store: nothing of ours above it."""
