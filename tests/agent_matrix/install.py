"""Install the matrix's agents at their pinned versions into ``.agents-cache/`` (git-ignored).

``python -m tests.agent_matrix.install [NAME ...]``: npm packages go to
``.agents-cache/npm/<name>`` (``npm install`` with that directory as its prefix), PyPI packages
to a virtual environment of their own at ``.agents-cache/<name>``, made with the first Python of
the version the agent needs (``$AGENT_MATRIX_PYTHON``, else ``python3.13``, ``python3.12``,
pyenv's versions, ``python3``). An agent already installed at its version is left alone. An
agent that cannot be installed here (no npm, no new enough Python) is reported and skipped; the
scenario then skips it with the same reason. Exits non-zero only if an install command failed.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.agent_matrix.agents import AGENTS, BY_NAME, CACHE, AgentSpec

SKIP_FILE = "skipped-reason"


def _python_version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_python(at_least: tuple[int, int]) -> str | None:
    candidates = [os.environ.get("AGENT_MATRIX_PYTHON", ""), "python3.13", "python3.12"]
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{root}/versions/3.*/bin/python3"), reverse=True)
    candidates += ["python3"]
    for candidate in candidates:
        if not candidate:
            continue
        path = shutil.which(candidate) if "/" not in candidate else candidate
        if path is None:
            continue
        version = _python_version(path)
        if version is not None and version >= at_least:
            return path
    return None


def skipped_reason(spec: AgentSpec) -> str | None:
    """Why ``spec`` was not installed here, as the installer recorded it."""
    try:
        return (spec.install_dir / SKIP_FILE).read_text().strip() or None
    except OSError:
        return None


def _skip(spec: AgentSpec, reason: str) -> None:
    spec.install_dir.mkdir(parents=True, exist_ok=True)
    (spec.install_dir / SKIP_FILE).write_text(reason + "\n")
    print(f"agent-matrix: {spec.name}: not installed: {reason}", flush=True)


def install(spec: AgentSpec) -> bool:
    """Install ``spec``; False if an install command failed."""
    if spec.installed():
        print(f"agent-matrix: {spec.name} {spec.version}: already installed", flush=True)
        return True
    target = spec.install_dir
    if spec.registry == "npm":
        npm = shutil.which("npm")
        if npm is None:
            _skip(spec, "npm is not installed (the agent is an npm package)")
            return True
        target.mkdir(parents=True, exist_ok=True)
        (target / SKIP_FILE).unlink(missing_ok=True)
        (target / "package.json").write_text(json.dumps({"private": True}) + "\n")
        command = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error",
                   "--prefix", str(target), f"{spec.package}@{spec.version}"]
    else:
        python = find_python(spec.python)
        if python is None:
            wanted = ".".join(map(str, spec.python))
            _skip(spec, f"no Python >= {wanted} found (set AGENT_MATRIX_PYTHON)")
            return True
        if target.exists():
            shutil.rmtree(target)
        subprocess.run([python, "-m", "venv", str(target)], check=True)
        command = [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet",
                   "--disable-pip-version-check", f"{spec.package}=={spec.version}"]
    print(f"agent-matrix: installing {spec.package} {spec.version} ...", flush=True)
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        print(f"agent-matrix: {spec.name}: install failed (exit {done.returncode})", flush=True)
        return False
    if spec.registry == "pypi":
        (target / "installed-version").write_text(spec.version + "\n")
    if not spec.installed():
        print(f"agent-matrix: {spec.name}: installed, but {spec.argv()[0]} is missing or the "
              f"version is {spec.installed_version()!r}", flush=True)
        return False
    return True


def main(argv: list[str]) -> int:
    names = argv or [spec.name for spec in AGENTS]
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        print(f"agent-matrix: unknown agents {unknown}; known: {sorted(BY_NAME)}")
        return 2
    CACHE.mkdir(exist_ok=True)
    ok = [install(BY_NAME[name]) for name in names]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
