"""Several workers on one PostgreSQL: leases, and who owns each conversation.

Owns: PostgreSQL as the coordination engine (`leases.py`: advisory-lock leases, LISTEN/NOTIFY,
the live workers) and the distributed gate (`owners.py`: which worker runs a place's turns,
pickup, failover, forwarded commands and firings).

May import `core.dispatch` (recovery per place), `core.turns`, `core.store` and the shared
types; not a feature: the scheduler reaches the owners through its own `Cluster` protocol.
"""
