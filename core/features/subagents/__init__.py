"""Sub-agents: work the conversation's agent hands off, run detached, reported back exactly once.

`agents.py` is the part (launching, carrying reports, stopping, what a restart left),
`delegation.py` what the model sees (the tools, whom it may choose, the caps' refusals),
`work.py` one run's agent loop, `routing.py` which model a run gets and why, `board.py` the
status message while runs work, `runs.py` the data, and `commands.py` `/agents`.
"""
