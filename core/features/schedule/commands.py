"""`/tasks`: the conversation's scheduled tasks, and pausing, resuming, cancelling or running one.

A person manages tasks here as the model does with its tools, on the same `Scheduler`
operations; a task is named by its id or its name, as `/tasks` shows them.
"""

from core.channel import Channel, ChannelMessage
from core.features.schedule.scheduler import Scheduler
from core.features.schedule.timing import describe_task
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
        if not verb:
            lines = await self._scheduler.listing(message.place)
            answer = "Tasks here:\n" + "\n".join(lines) if lines else NO_TASKS
        elif verb in VERBS and target.strip():
            answer = await self._verb(message.place, verb, target.strip())
        else:
            answer = "Usage: /tasks, or /tasks pause|resume|cancel|run ID (the ids /tasks shows)."
        await channel.notify(message.place, answer)

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
