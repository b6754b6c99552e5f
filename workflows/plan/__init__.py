"""`/plan <task>`: the agent drafts a plan, an independent critic reviews it, then the agent
carries it out step by step, the thread watching.

Why a workflow rather than a longer prompt: each phase is a separate, bounded use of the model
whose result is checked by code. The draft is structured data (`submit_plan`, a final tool whose
schema the arguments must meet), so the steps can be stored, shown and run one by one. The
critic runs aside (`BodyTurn.aside`): it reads the task and the plan and nothing else (no
conversation, no archive), with a few read-only tools and a fixed cap of `CRITIC_CALLS` model
calls, so it judges the plan rather than agreeing with the talk that led to it. A rejection goes
back to the drafter with the reasons, at most `review_rounds` times. `ask_person` then waits for
the asker's Approve / Edit / Reject (`core.features.approvals.questions`, so buttons, typed answers,
timeouts, `/stop` and restarts behave as a tool's approval does); an unattended run (a scheduled
`/plan`) skips it.

Each step is an instruction to the agent (stored with the turn, so the conversation reads the
same afterwards) and a run of the ordinary agent loop with the turn's tools; the agent may end a
step with `step_failed`, which stops the plan. A progress message (✓ done, ▶ running, · waiting)
is edited as the plan moves.

Records before notices, here too: every change of the plan is stored (awaited) before the
progress message shows it. A stop ends the running step with its partial text kept as its
result, marks the rest not run and stores that through the cancellation, then lets the stop go on
to the turn runner, which ends the turn as it ends any stopped turn.

The package: `workflow.py` (the body, its leftovers and its commands), `run.py` (one plan from
draft to end), `texts.py` (what the model is told and gives back), `progress.py` (what people
read), `settings.py`. It may import `core` (the turn runner's body and parts interfaces, the
store, approvals' questions), never `bot` or `channels`.
"""
