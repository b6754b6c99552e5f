"""The fakes are the one module tests and benchmarks share, so they stand alone: importing them
loads neither pytest, nor the rest of `tests/`, nor any of Kaiwa's own packages. A benchmark
then measures the bot beside fakes that bring nothing of the test suite with them."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SERVERS = (
    "ollama",
    "telegram",
    "slack",
    "discord",
    "tcp_proxy",
    "mcp_server",
    "transcription",
    "voice",
)
PROBE = f"""
import sys
for name in {SERVERS!r}:
    __import__("tests.fakes." + name)
ours = ("bot", "channels", "core", "workflows", "benchmarks")
print(sorted(
    module for module in sys.modules
    if module == "pytest" or module.split(".")[0] in ours
    or (module.startswith("tests.") and not module.startswith("tests.fakes"))
))
"""


def test_the_fake_servers_import_nothing_of_the_tests_or_the_bot() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )

    assert probe.stdout.strip() == "[]"
