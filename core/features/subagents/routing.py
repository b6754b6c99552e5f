"""Which model a sub-agent runs on when `[subagents.routing]` is on, by rules a person can check.

A cheap tier is earned, never assumed: a task reaches `small` or `medium` only when every
condition of its tier holds (its kind, read-only tools, an instruction within a length, success
criteria within a length), and anything else goes to `large`, never promoted to the tier in
between. Words that signal a security decision, an action on the world or clearly complex work
send a task to `large` whatever its kind, before any other rule is read. The rules are plain
functions of the task, tried in order; the first that decides names itself in the `Route`'s
reason, which every view prints as `tier: reason`, so the choice can always be explained.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from core.agent.model import model_is_available
from core.agent.tools import Tool

SMALL, MEDIUM, LARGE = "small", "medium", "large"
SMALL_INSTRUCTION = 2000
"""Characters an `extract` or `format` instruction may have and still run on `small`."""
MEDIUM_INSTRUCTION = 4000
"""Characters an `analyze` instruction may have and still run on `medium`."""
MAX_CRITERIA = 1000
"""Characters a cheap tier's success criteria may have."""
SECURITY = (
    "security",
    "secure",
    "vulnerability",
    "vulnerabilities",
    "exploit",
    "credential",
    "credentials",
    "password",
    "passwords",
    "secret",
    "secrets",
    "permission",
    "permissions",
    "firewall",
    "authentication",
    "authenticate",
    "authorize",
    "authorization",
    "encryption",
    "private key",
)
WORLD_ACTIONS = (
    "delete",
    "remove",
    "deploy",
    "send",
    "email",
    "post",
    "publish",
    "pay",
    "purchase",
    "buy",
    "transfer",
    "refund",
    "install",
    "uninstall",
    "restart",
    "reboot",
    "merge",
    "push",
    "book",
    "cancel",
)
COMPLEX = (
    "architect",
    "architecture",
    "design",
    "refactor",
    "debug",
    "migrate",
    "migration",
    "strategy",
    "root cause",
    "multi-step",
    "optimize",
)


def _whole_words(words: Sequence[str]) -> re.Pattern[str]:
    return re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b", re.IGNORECASE)


SIGNALS = (
    (_whole_words(SECURITY), "signals a security decision"),
    (_whole_words(WORLD_ACTIONS), "is an action on the world"),
    (_whole_words(COMPLEX), "signals complex work"),
)
CHEAP_KINDS = {
    "extract": (SMALL, SMALL_INSTRUCTION),
    "format": (SMALL, SMALL_INSTRUCTION),
    "analyze": (MEDIUM, MEDIUM_INSTRUCTION),
}
"""The kinds a cheap tier may take, each with its tier and its longest instruction."""
CHEAP_TIERS = frozenset({SMALL, MEDIUM})
"""Tiers whose runs are not offered `delegate`: a cheap run cannot widen itself by a child."""


@dataclass(frozen=True)
class Route:
    """A routed task's tier, the model of that tier, and the rule that decided (no tier in it)."""

    tier: str
    model: str
    reason: str


@dataclass(frozen=True)
class RoutingSettings:
    """[subagents.routing]: a model per tier instead of each profile's own (off by default)."""

    enabled: bool = False
    small: str = ""
    """For short `extract` and `format` tasks with read-only tools and success criteria."""
    medium: str = ""
    """For `analyze` tasks with read-only tools and success criteria, up to a longer length."""
    large: str = ""
    """For everything else."""

    def route(
        self, kind: str, instruction: str, criteria: str, tools: Sequence[Tool]
    ) -> Route | None:
        """The tier and model for a task, and why; None when routing is off."""
        if not self.enabled:
            return None
        tier, reason = decide(kind, instruction, criteria, tools)
        return Route(tier, {SMALL: self.small, MEDIUM: self.medium}.get(tier, self.large), reason)

    def problems(self, available: Sequence[str]) -> list[str]:
        """What would make a routed run fail or mean nothing, each with its fix, against the
        models Ollama has (`available`): a tier left empty, a tier naming a model Ollama does
        not have, a tier naming another's model. None when routing is off."""
        if not self.enabled:
            return []
        problems, named = [], {}
        for tier, model in ((SMALL, self.small), (MEDIUM, self.medium), (LARGE, self.large)):
            key = f"[subagents.routing].{tier}"
            same = named.setdefault(model if ":" in model else f"{model}:latest", tier)
            if not model:
                problems.append(f"{key} is empty: name a model, or set enabled = false")
            elif same != tier:
                problems.append(
                    f"[subagents.routing].{same} and {tier} both name {model}: give each tier "
                    "its own model"
                )
            elif not model_is_available(model, available):
                problems.append(
                    f"{key} names {model}, which Ollama does not have: run `ollama pull {model}`"
                )
        return problems

    def off(self) -> "RoutingSettings":
        return replace(self, enabled=False)


def decide(kind: str, instruction: str, criteria: str, tools: Sequence[Tool]) -> tuple[str, str]:
    """The tier a task earns, and the rule that decided it."""
    signal = _signal(f"{instruction}\n{criteria}")
    if signal:
        return LARGE, signal
    if kind not in CHEAP_KINDS:
        return LARGE, f"a task of kind '{kind}'" if kind else "no kind given"
    tier, limit = CHEAP_KINDS[kind]
    task = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} task"
    failed = _ineligible(instruction, criteria, tools, limit)
    if failed:
        return LARGE, f"{task} {failed}"
    return tier, (
        f"{task} with read-only tools, success criteria and an instruction of at most "
        f"{limit:,} characters"
    )


def _signal(text: str) -> str:
    """Why a word of `text` sends its task to large, or ''."""
    for words, meaning in SIGNALS:
        found = words.search(text)
        if found:
            return f"'{found.group(1).lower()}' {meaning}"
    return ""


def _ineligible(instruction: str, criteria: str, tools: Sequence[Tool], limit: int) -> str:
    """The first condition of a cheap tier that a task fails, worded to follow 'an extract
    task', or '' when it meets them all."""
    changing = [each.name for each in tools if not each.read_only]
    if changing:
        which = "a tool that changes" if len(changing) == 1 else "tools that change"
        return f"with {which} things ({', '.join(changing)})"
    if len(instruction) > limit:
        return f"whose instruction is over {limit:,} characters"
    if not criteria.strip():
        return "without success criteria"
    if len(criteria.strip()) > MAX_CRITERIA:
        return f"with criteria over {MAX_CRITERIA:,} characters"
    return ""
