"""The turn path: every message, scheduled firing and carried report becomes a turn here.

Owns: the runner (`runner.py`, whose docstring states the turn-path invariants), what a turn is
(`turn.py`: request, result, settings), each conversation between turns (`conversations.py`:
gate, queue, history), what runs inside a turn (`body.py`), how it ends (`endings.py`: records,
then the notice), its records (`recording.py`) and its frames (`pump.py`), and the interface
features plug into (`parts.py`). `lru.py` keeps conversations within a bound.

May import `core.agent`, `core.store` and the shared types; never a feature, the dispatcher or
the cluster: those import it (drivers call the runner; features implement `parts.Part`).
"""
