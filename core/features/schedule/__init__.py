"""Scheduled tasks: a prompt that fires on its own, in the place it was asked for, as a turn.

`scheduler.py` is the driver (timers woken, slots claimed, tasks made and changed), `firing.py`
a claimed slot run as a turn, `timers.py` the APScheduler jobs, `timing.py` triggers, zones,
slots and words, `tools.py` the model's task tools and `commands.py` `/tasks`.
"""
