"""The sliding deadline: late first chunk, silence between chunks, and others' cancellations."""

import asyncio

import pytest

from core.agent.deadline import SlidingDeadline


async def test_a_late_first_chunk_times_out() -> None:
    with pytest.raises(TimeoutError), SlidingDeadline(first=0.01, idle=10) as deadline:
        await asyncio.Event().wait()
    assert deadline.waiting_for_first


async def test_silence_after_the_first_chunk_uses_the_idle_limit() -> None:
    with pytest.raises(TimeoutError), SlidingDeadline(first=10, idle=0.01) as deadline:
        deadline.touch()
        await asyncio.Event().wait()
    assert not deadline.waiting_for_first


async def test_activity_keeps_it_alive() -> None:
    with SlidingDeadline(first=10, idle=10) as deadline:
        for _ in range(100):
            deadline.touch()
            await asyncio.sleep(0)
    assert not deadline.expired


async def test_someone_elses_cancellation_passes_through() -> None:
    started = asyncio.Event()

    async def guarded() -> None:
        with SlidingDeadline(first=10, idle=10):
            started.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(guarded())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
