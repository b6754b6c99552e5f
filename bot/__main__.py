"""`python -m bot` is `kaiwa`, for when the console script is not on PATH."""

from bot.cli import main

raise SystemExit(main())
