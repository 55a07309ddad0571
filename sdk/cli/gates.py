"""Where the bundled mock agent's gates are, for ``turnkeeper release NAME``.

The daemon gives its bundled mock agent a gate directory: ``$MOCK_ACP_GATE_DIR`` if set, else
``gates`` in its data directory (``$TURNKEEPER_DATA_DIR``, else ``$XDG_STATE_HOME/turnkeeper``,
else ``~/.local/state/turnkeeper``). A prompt saying ``mock:gate=NAME`` waits until the file
``NAME`` exists there; releasing the gate is creating that file. The same rules as the daemon's
(tests/sdk/test_cli.py holds them equal), read here without importing the daemon.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from sdk.cli.parser import UsageError

GATE_DIR_ENV: Final = "MOCK_ACP_GATE_DIR"
DATA_DIR_ENV: Final = "TURNKEEPER_DATA_DIR"
GATES: Final = "gates"


def default_data_dir(env: Mapping[str, str]) -> Path:
    given = env.get(DATA_DIR_ENV)
    if given:
        return Path(given)
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "turnkeeper"


def gate_dir(given: str | None, env: Mapping[str, str]) -> Path:
    """``--gate-dir`` if given, else the daemon's default for the same environment."""
    if given:
        return Path(given)
    from_env = env.get(GATE_DIR_ENV)
    if from_env:
        return Path(from_env)
    return default_data_dir(env) / GATES


def gate_name(name: str) -> str:
    """A gate is a plain file name (as the mock agent requires of mock:gate=NAME)."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise UsageError(f"a gate name is a plain file name, got {name!r}")
    return name
