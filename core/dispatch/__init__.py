"""What drives turns: messages as they arrive, commands, and what a dead process left.

Owns: the dispatcher (`dispatcher.py`: one door for every message, deduplication, access rules,
commands before anything queues), the turn path's own commands and the registry features add
theirs to (`commands.py`), and recovery at start-up (`recovery.py`: turns, messages and endings
a dead process left, and each part's leftovers).

May import `core.turns`, `core.store`, `core.agent` and the shared types; not a feature (they
are handed in as parts and commands) and not the cluster (it is a `Placement`, a protocol here).
"""
