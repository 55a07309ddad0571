"""The git branch of each workspace, for ``GET /daemon/status`` (the viewer's branch chip).

Reads ``<workspace>/.git/HEAD`` (following a ``.git`` file's ``gitdir:``) in a worker thread;
the rules are the pure :mod:`daemon.core.git_head`. Anything unreadable is simply no branch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import trio

from .core.git_head import MAX_HEAD_BYTES, branch_from_head, gitdir_from_file

__all__ = ["branches", "read_branch"]


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_HEAD_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def read_branch(workspace: str) -> str | None:
    """The branch checked out in ``workspace`` (blocking: call from a thread)."""
    dot_git = os.path.join(workspace, ".git")
    if os.path.isfile(dot_git):
        text = _read(dot_git)
        target = gitdir_from_file(text) if text is not None else None
        if target is None:
            return None
        dot_git = os.path.join(workspace, target)
    head = _read(os.path.join(dot_git, "HEAD"))
    return branch_from_head(head) if head is not None else None


async def branches(workspaces: Iterable[str]) -> dict[str, str | None]:
    """``{workspace: branch or None}`` for each distinct workspace, in one worker thread."""
    unique = sorted(set(workspaces))
    if not unique:
        return {}
    return await trio.to_thread.run_sync(lambda: {cwd: read_branch(cwd) for cwd in unique})
