"""Turn bodies with more structure than chat: `plan/` (`/plan`: draft, independent review,
execute step by step). A workflow uses `core` (the runner's body and parts interfaces); bot/
registers it."""
