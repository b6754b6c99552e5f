"""`/tasks`: the conversation's scheduled tasks, and pausing, resuming, cancelling or running one.

A person manages tasks here as the model does with its tools, on the same `Scheduler`
operations; a task is named by its id or its name, as `/tasks` shows them. The listing carries
a button for each task's next step (Pause or Resume, and Run now), whose commands are the verbs
typed; a task done for good (one that ran once) has none.
"""

from core.channel import Button, Channel, ChannelMessage
from core.features.schedule.scheduler import Scheduler
from core.features.schedule.timing import describe_task
from core.store.tables import ScheduledTask
from core.text import Command

VERBS = ("pause", "resume", "cancel", "run")
NO_TASKS = (
    'No scheduled tasks here. Ask for one in words ("every weekday at 9:00, summarize the '
    'open incidents here") and I will schedule it.'
)
TASKS_OFF = "Scheduled tasks are off ([schedule].enabled = false in config.toml)."


class TasksCommand:
    """The `/tasks` handler of a dispatcher."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    async def __call__(self, message: ChannelMessage, channel: Channel, command: Command) -> None:
        verb, _, target = command.argument.partition(" ")
        buttons: list[Button] = []
        if not verb:
            described = await self._scheduler.described(message.place)
            lines = [line for _, line in described]
            answer = "Tasks here:\n" + "\n".join(lines) if lines else NO_TASKS
            buttons = [button for task, _ in described for button in task_buttons(task)]
        elif verb in VERBS and target.strip():
            answer = await self._verb(message.place, verb, target.strip())
        else:
            answer = "Usage: /tasks, or /tasks pause|resume|cancel|run ID (the ids /tasks shows)."
        await channel.notify(message.place, answer, buttons)

    async def _verb(self, place: str, verb: str, target: str) -> str:
        task = await self._scheduler.find(place, target)
        if task is None:
            return f"No task {target} here; /tasks lists them."
        label = f"#{task.id} {task.name}"
        if verb == "pause":
            await self._scheduler.pause(task, "paused with /tasks")
            return f"Paused task {label}; /tasks resume {task.id} starts it again."
        if verb == "resume":
            resumed = await self._scheduler.resume(task)
            return f"Resumed: {describe_task(resumed, None)}"
        if verb == "cancel":
            await self._scheduler.cancel(task)
            return f"Cancelled task {label}; it will not fire again."
        if not await self._scheduler.run_now(task):
            return f"Task {label} is already running (started this second); its answer follows."
        return f"Task {label} runs now; its answer follows here."


def task_buttons(task: ScheduledTask) -> list[Button]:
    """What a person may do with `task` now: pause or resume it, run it now."""
    label = f"#{task.id} {task.name}"
    if task.enabled and task.next_run is None:
        return []  # it ran once and is done
    toggle = (
        Button(f"Pause {label}", f"/tasks pause {task.id}")
        if task.enabled
        else Button(f"Resume {label}", f"/tasks resume {task.id}")
    )
    return [toggle, Button(f"Run {label} now", f"/tasks run {task.id}")]
