"""Kaiwa's core: everything but the platforms and the wiring. Nothing of ours above it.

A house of packages, each owning one concern, with arrows one way only (pyproject.toml's
import-linter contracts, checked in CI; ARCHITECTURE.md draws them):

    cluster                 several workers: leases, and who owns each conversation
    dispatch | features     what drives turns (the dispatcher, commands, recovery) | what a turn
                            uses (sub-agents, approvals, scheduled tasks, notes, archive, fetch,
                            MCP), each feature on its own
    turns                   the turn runner: gate, pin, stop, recording, notices; the interface
                            features plug into (`core.turns.parts`)
    store                   the database: one `Store`, a module per kind of row
    agent                   the agent loop, the model client, context, tools
    channel, text, errors   the small shared types every package may use

A package imports only packages below it, never one beside it (dispatch and features do not
know each other, nor do two features).
"""
