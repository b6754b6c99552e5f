"""The agent loop and what it needs: one agent answering with a model and tools.

Owns: the loop (`loop.py`: model calls, tools, the caps, the sink contract), the model client
(`model.py`, Ollama; `slots.py`, the queue of requests; `deadline.py`, a stream's timeouts),
a conversation's context (`context.py`: sizes, windows, compaction), tools (`tools.py`: schemas
from signatures, the calling context), the messages it exchanges (`messages.py`) and an agent as
configured (`profile.py`).

May import only `core.channel`, `core.text` and `core.errors`: the loop takes a model, tools,
messages and a sink, and returns a result, knowing nothing of turns, the store or a platform.
"""
