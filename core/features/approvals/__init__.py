"""Approvals: a risky tool runs only once a person in the conversation says yes.

`questions.py` asks, waits and settles (the turn parts' `ToolGuard`, and a part whose questions
outlive a process); `commands.py` is `/approve`, `/edit` and `/deny`.
"""
