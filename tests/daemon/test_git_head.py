"""The workspace's git branch (daemon.core.git_head, and the shell that reads .git)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.git_head import branch_from_head, gitdir_from_file
from daemon.workspace_git import read_branch


@pytest.mark.parametrize(("text", "branch"), [
    ("ref: refs/heads/main\n", "main"),
    ("ref: refs/heads/feature/x", "feature/x"),
    ("0123456789abcdef0123456789abcdef01234567\n", None),  # detached
    ("ref: refs/tags/v1\n", None),
    ("ref: refs/heads/\n", None),
    ("ref: refs/heads/a\nref: refs/heads/b\n", None),
    ("", None),
])
def test_branch_from_head(text: str, branch: str | None) -> None:
    assert branch_from_head(text) == branch


def test_gitdir_from_file() -> None:
    assert gitdir_from_file("gitdir: ../.git/worktrees/x\n") == "../.git/worktrees/x"
    assert gitdir_from_file("gitdir:   \n") is None
    assert gitdir_from_file("something else") is None


def test_read_branch_follows_a_worktree_gitdir_file(tmp_path: Path) -> None:
    main, wt = tmp_path / "main", tmp_path / "wt"
    (main / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (main / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (main / ".git" / "worktrees" / "wt" / "HEAD").write_text("ref: refs/heads/topic\n")
    wt.mkdir()
    (wt / ".git").write_text("gitdir: ../main/.git/worktrees/wt\n")
    assert read_branch(str(main)) == "main"
    assert read_branch(str(wt)) == "topic"
    assert read_branch(str(tmp_path)) is None  # not a checkout
    assert read_branch(str(tmp_path / "missing")) is None
