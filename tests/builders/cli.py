"""Running the SDK's command line (``python -m sdk``) as a subprocess against a daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ROOT", "argv", "cli", "cli_env"]

ROOT = Path(__file__).resolve().parents[2]
CLI_WAIT_S = 30.0


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without a token (each call says its own), unbuffered."""
    env = {k: v for k, v in os.environ.items() if k != "QWEN_SERVER_TOKEN"}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def argv(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "sdk", "--url", url, *args]


def cli(
    url: str, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One command, run to its end (at most ``CLI_WAIT_S``), its output captured as text."""
    return subprocess.run(
        argv(url, *args),
        cwd=ROOT,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=CLI_WAIT_S,
        check=False,
    )
