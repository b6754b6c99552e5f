"""Slack's refusals, sorted by what Kaiwa does about them: wait, try again later, or ask a person.

slack_sdk raises `SlackApiError` for every refusal: `{"ok": false, "error": ...}` (HTTP 200), an
HTTP 429 with `Retry-After`, and an HTTP 5xx whose body may not even be JSON (a proxy's error
page). `Refusal.of` reads one safely, whatever its body, and names what it is:
- `rate_limited` (HTTP 429 or `ratelimited`): waited out, as long as Slack asks
  (`Refusal.retry_after`), at start as at any other time;
- `needs_a_person` (`AUTH_ERRORS`: a token Slack will not take, or one missing a scope): only
  its owner can fix it, so it stops the channel with the fix (`token_problem`);
- anything else: Slack's trouble, not the settings (`server_side` for an HTTP 5xx or
  `SERVER_ERRORS`, said as a server error), tried again later.
"""

from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackApiError

AUTH_ERRORS = frozenset(
    {
        "account_inactive",
        "ekm_access_denied",
        "enterprise_is_restricted",
        "invalid_auth",
        "missing_scope",
        "no_permission",
        "not_allowed_token_type",
        "not_authed",
        "org_login_required",
        "team_access_not_granted",
        "token_expired",
        "token_revoked",
    }
)
"""Errors that say the token itself is refused: a person must give Kaiwa another."""
SERVER_ERRORS = frozenset(
    {"fatal_error", "internal_error", "request_timeout", "service_unavailable"}
)
DEFAULT_RETRY_AFTER = 1.0
"""Seconds to wait on a rate limit that does not say (Slack's 429s always do)."""


@dataclass(frozen=True)
class Refusal:
    method: str
    status: int
    error: str
    """Slack's error code; empty when the answer had none (a proxy's error page)."""
    retry_after: float = DEFAULT_RETRY_AFTER
    needed: str = ""
    """The scope a `missing_scope` refusal names."""

    @classmethod
    def of(cls, exc: SlackApiError, method: str) -> "Refusal":
        """`exc` read safely: its response may be Slack's JSON, an empty body or a page."""
        response = exc.response
        status = getattr(response, "status_code", None) or getattr(response, "status", 0)
        data: Any = getattr(response, "data", None)
        body = data if isinstance(data, dict) else {}
        headers = getattr(response, "headers", None) or {}
        return cls(
            method=method,
            status=int(status or 0),
            error=str(body.get("error") or ""),
            retry_after=_seconds(headers.get("Retry-After") or headers.get("retry-after")),
            needed=str(body.get("needed") or ""),
        )

    @property
    def rate_limited(self) -> bool:
        return self.status == 429 or self.error == "ratelimited"

    @property
    def needs_a_person(self) -> bool:
        return self.error in AUTH_ERRORS

    @property
    def server_side(self) -> bool:
        return self.status >= 500 or self.error in SERVER_ERRORS

    @property
    def code(self) -> str:
        """What Slack said, as a person can look it up: "HTTP 500, fatal_error"."""
        parts = [f"HTTP {self.status}" if self.status not in (0, 200) else "", self.error]
        return ", ".join(part for part in parts if part) or "no reason given"

    def described(self) -> str:
        """The refusal in one phrase: "Slack had a server error answering auth.test (HTTP 500)"."""
        if self.rate_limited:
            return f"Slack rate-limits {self.method} (for {self.retry_after:g} s)"
        if self.server_side:
            return f"Slack had a server error answering {self.method} ({self.code})"
        return f"Slack refused {self.method} ({self.code})"

    def token_problem(self, kind: str, variable: str) -> str:
        """What to do about a token Slack refused (`needs_a_person`)."""
        if self.error == "missing_scope" and self.needed:
            return (
                f"the Slack {kind} in ${variable} lacks the scope {self.needed}: add it in your "
                "app's settings, reinstall the app, and copy the new token into that variable"
            )
        return (
            f"Slack rejected the {kind} in ${variable} ({self.error}): copy it again from your "
            "app's settings"
        )


def _seconds(value: object) -> float:
    try:
        return max(0.0, float(str(value)))
    except ValueError:
        return DEFAULT_RETRY_AFTER
