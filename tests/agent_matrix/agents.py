"""The agents of the matrix: where each comes from (a pinned npm or PyPI package), the command
line the daemon runs, and the environment and config files that point it at the fake model
server with a fake key.

Each agent gets a HOME of its own (kept across the scenario's daemon restart, so the agent's own
session store survives it, as it would for a user), and its config files are written there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(__file__).resolve().parents[2] / ".agents-cache"
FAKE_KEY = "fake-key-for-the-agent-matrix"


@dataclass(frozen=True)
class AgentSpec:
    name: str
    # "npm" (installed under CACHE/npm/<name>) or "pypi" (a venv at CACHE/<name>).
    registry: str
    package: str
    version: str
    # The command line, relative to the agent's install directory (its first word is the bin).
    command: tuple[str, ...]
    # Environment beyond HOME, given the fake server's URL.
    env: Callable[[str], dict[str, str]]
    # Writes config files under the agent's HOME, given the fake server's URL and HOME.
    setup: Callable[[str, Path], None] = lambda url, home: None
    # Which API the fake must have served for the agent's turns.
    api: str = "anthropic"
    # Needs a Python of at least this version (PyPI agents).
    python: tuple[int, int] = (3, 11)
    # The agent's own session/load is known to fail at times (then the daemon must say so:
    # agentSessionRestored false, and the agent's context is gone).
    load_may_fail: bool = False
    # An update the agent sends right after its session/new reply, which must reach the
    # session (opencode writes it in the same read as the reply).
    update_after_new: str | None = None

    @property
    def install_dir(self) -> Path:
        return CACHE / ("npm" if self.registry == "npm" else "") / self.name

    def argv(self) -> list[str]:
        if self.registry == "npm":
            binary = self.install_dir / "node_modules" / ".bin" / self.command[0]
        else:
            binary = self.install_dir / "bin" / self.command[0]
        return [str(binary), *self.command[1:]]

    def installed(self) -> bool:
        return Path(self.argv()[0]).exists() and self.installed_version() == self.version

    def installed_version(self) -> str | None:
        if self.registry == "npm":
            manifest = self.install_dir / "node_modules" / self.package / "package.json"
            try:
                version = json.loads(manifest.read_text())["version"]
            except (OSError, ValueError, KeyError):
                return None
            return str(version)
        stamp = self.install_dir / "installed-version"
        try:
            return stamp.read_text().strip()
        except OSError:
            return None


# --------------------------------------------------------------------------------------------
# Per-agent environment and config


def _quiet_claude(url: str) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": FAKE_KEY,
        # Claude Code refuses to skip permission prompts as root outside a sandbox; the adapter
        # asks for that mode, so as root it exits during start-up without this.
        "IS_SANDBOX": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def _claude_setup(url: str, home: Path) -> None:
    # Claude Code 2.1 (under claude-agent-acp 0.101) appends a one-off notice about auto mode's
    # classifier billing to the first answer when requests go to another host than
    # Anthropic's, until the user acknowledges it; this is that acknowledgement.
    (home / ".claude.json").write_text(json.dumps({
        "autoModeClassifierBillingNoticeAcknowledgedAt": int(time.time() * 1000)}))


def _gemini_env(url: str) -> dict[str, str]:
    return {"GEMINI_API_KEY": FAKE_KEY, "GOOGLE_GEMINI_BASE_URL": url,
            "GEMINI_CLI_NO_RELAUNCH": "true"}


def _gemini_setup(url: str, home: Path) -> None:
    settings = home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }))


def _codex_env(url: str) -> dict[str, str]:
    return {"OPENAI_API_KEY": FAKE_KEY, "CODEX_API_KEY": FAKE_KEY,
            "OPENAI_BASE_URL": f"{url}/v1"}


def _codex_setup(url: str, home: Path) -> None:
    config = home / ".codex" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        'model = "gpt-5.4"\n'
        'model_provider = "fake"\n'
        'approval_policy = "never"\n'
        '[model_providers.fake]\n'
        'name = "fake"\n'
        f'base_url = "{url}/v1"\n'
        'env_key = "OPENAI_API_KEY"\n'
        'wire_api = "responses"\n'
        'request_max_retries = 0\n'
        'stream_max_retries = 0\n'
    )


def _opencode_env(url: str) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": FAKE_KEY, "OPENCODE_DISABLE_MODELS_FETCH": "true",
            "OPENCODE_DISABLE_AUTOUPDATE": "true", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "true",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "true"}


def _opencode_setup(url: str, home: Path) -> None:
    config = home / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "model": "anthropic/claude-sonnet-4-5",
        "small_model": "anthropic/claude-sonnet-4-5",
        "autoupdate": False,
        "share": "disabled",
        "provider": {"anthropic": {"options": {"baseURL": f"{url}/v1", "apiKey": FAKE_KEY}}},
    }))


def _vibe_env(url: str) -> dict[str, str]:
    return {"FAKE_MODEL_API_KEY": FAKE_KEY, "MISTRAL_API_KEY": FAKE_KEY}


def _vibe_setup(url: str, home: Path) -> None:
    config = home / ".vibe" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        'active_model = "fake"\n'
        '[[providers]]\n'
        'name = "fake"\n'
        f'api_base = "{url}/v1"\n'
        'api_key_env_var = "FAKE_MODEL_API_KEY"\n'
        'backend = "generic"\n'
        '[[models]]\n'
        'name = "fake-model"\n'
        'provider = "fake"\n'
        'alias = "fake"\n'
    )


AGENTS: tuple[AgentSpec, ...] = (
    AgentSpec("claude-code-acp", "npm", "@zed-industries/claude-code-acp", "0.16.2",
              ("claude-code-acp",), _quiet_claude),
    AgentSpec("claude-agent-acp", "npm", "@agentclientprotocol/claude-agent-acp", "0.101.0",
              ("claude-agent-acp",), _quiet_claude, _claude_setup),
    AgentSpec("gemini-cli", "npm", "@google/gemini-cli", "0.61.0", ("gemini", "--acp"),
              _gemini_env, _gemini_setup, api="gemini", load_may_fail=True),
    AgentSpec("codex-acp", "npm", "@zed-industries/codex-acp", "0.16.0", ("codex-acp",),
              _codex_env, _codex_setup, api="responses"),
    AgentSpec("opencode", "npm", "opencode-ai", "1.18.33", ("opencode", "acp"),
              _opencode_env, _opencode_setup, update_after_new="available_commands_update"),
    AgentSpec("mistral-vibe", "pypi", "mistral-vibe", "2.26.1", ("vibe-acp",),
              _vibe_env, _vibe_setup, api="chat", python=(3, 12)),
)

BY_NAME = {spec.name: spec for spec in AGENTS}


def agent_env(spec: AgentSpec, url: str, home: Path) -> dict[str, str]:
    """The daemon's environment for ``spec`` (the daemon passes its own to the agent): this
    process's, with HOME (and the XDG dirs) moved to ``home`` and the agent's variables."""
    env = dict(os.environ)
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env.pop(name, None)
    env["HOME"] = str(home)
    env.update(spec.env(url))
    return env
