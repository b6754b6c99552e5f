"""deploy/ read as Docker Compose and systemd read it (no engine runs here): neither restarts a
worker that cannot serve for want of a token, and both give a worker the same config."""

import configparser
from pathlib import Path
from typing import Any

import yaml

from bot.cli import CONFIG_ERROR, NOTHING_TO_SERVE

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def compose() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())[
        "services"
    ]
    return services


def test_compose_starts_no_worker_that_kaiwa_check_fails() -> None:
    """Regression (issue 33): with an empty .env every worker exited at once and Compose
    restarted it in a loop. Compose cannot leave one exit status alone, so a one-shot `kaiwa
    check` with the workers' own image, config and environment runs first, never restarted,
    and the workers start only once it succeeds (it fails when no channel would start)."""
    services = compose()
    check, worker = services["kaiwa-check"], services["kaiwa"]

    assert check["command"] == ["check"]
    assert check["restart"] == "no"
    assert worker["depends_on"]["kaiwa-check"] == {"condition": "service_completed_successfully"}
    for key in ("image", "build", "env_file", "environment", "volumes"):
        assert check[key] == worker[key], key
    assert worker["restart"] == "unless-stopped"


def test_systemd_does_not_restart_what_a_restart_cannot_fix() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "kaiwa.service")
    service = unit["Service"]

    assert service["Restart"] == "on-failure"
    prevented = {int(code) for code in service["RestartPreventExitStatus"].split()}
    assert prevented == {CONFIG_ERROR, NOTHING_TO_SERVE}
