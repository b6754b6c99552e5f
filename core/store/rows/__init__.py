"""One module per kind of row: its methods on `Store`, its statements and its records.

`inbox.py` (platform messages as recorded), `conversations.py`, `turns.py` (turns and their
messages), `compactions.py`, `subagent_runs.py` (runs and their transcripts), `tasks.py`
(scheduled tasks and their runs), `notes.py`, `approvals.py`, `plans.py` and `archive.py`
(searching past conversations). Each class derives from `core.store.base.StoreBase`, and
`core.store.store.Store` combines them.
"""
