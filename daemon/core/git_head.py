"""The branch a workspace has checked out, read from its ``.git`` (pure: text in, name out).

A checkout's ``.git`` is a directory holding ``HEAD``, or (a worktree, a submodule) a file
``gitdir: <path>`` naming the directory that holds it. ``HEAD`` is ``ref: refs/heads/<branch>``
on a branch, or a bare commit id when detached. The viewer shows the branch beside the
workspace; ``None`` means "not on a branch we can name" and nothing is shown.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_HEAD_BYTES", "branch_from_head", "gitdir_from_file"]

MAX_HEAD_BYTES: Final = 4096
_BRANCH_REF: Final = "ref: refs/heads/"
_GITDIR: Final = "gitdir: "


def branch_from_head(text: str) -> str | None:
    """The branch named by a ``HEAD`` file's text; ``None`` when detached or not a HEAD."""
    line = text.strip()
    if not line.startswith(_BRANCH_REF) or "\n" in line:
        return None
    name = line[len(_BRANCH_REF):]
    return name if name and name.isprintable() else None


def gitdir_from_file(text: str) -> str | None:
    """The directory a ``.git`` *file* points to (``gitdir: <path>``), else ``None``."""
    line = text.strip()
    if not line.startswith(_GITDIR) or "\n" in line:
        return None
    path = line[len(_GITDIR):].strip()
    return path or None
