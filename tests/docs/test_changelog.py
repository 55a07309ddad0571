"""CHANGELOG.md keeps its shape: an Unreleased section on top, then releases newest first, each
with a date and at most one section per kind of change (Keep a Changelog's names); the newest
release is the package's version."""

from __future__ import annotations

import re
from pathlib import Path

from sdk.protocol import __version__

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
RELEASE = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$")


def releases() -> list[tuple[str, str | None, list[str]]]:
    found: list[tuple[str, str | None, list[str]]] = []
    for line in (ROOT / "CHANGELOG.md").read_text().splitlines():
        if line.startswith("## "):
            match = RELEASE.fullmatch(line)
            assert match is not None, f"not a release heading: {line!r}"
            found.append((match["name"], match["date"], []))
        elif line.startswith("### "):
            assert found, f"{line!r} before any release"
            found[-1][2].append(line[4:].strip())
    return found


def test_unreleased_on_top_then_dated_releases_newest_first() -> None:
    found = releases()
    assert found[0][0] == "Unreleased" and found[0][1] is None
    dated = found[1:]
    assert dated, "no release"
    for name, date, _ in dated:
        assert re.fullmatch(r"\d+\.\d+\.\d+", name), name
        assert date is not None, f"release {name} has no date"
    versions = [tuple(int(p) for p in name.split(".")) for name, _, _ in dated]
    assert versions == sorted(versions, reverse=True)
    assert [d for _, d, _ in dated] == sorted((d for _, d, _ in dated), reverse=True)


def test_one_section_per_kind_of_change() -> None:
    for name, _, kinds in releases():
        assert all(kind in KINDS for kind in kinds), (name, kinds)
        assert len(kinds) == len(set(kinds)), f"{name} repeats a section: {kinds}"
        assert kinds == sorted(kinds, key=KINDS.index), f"{name}: sections out of order {kinds}"


def test_the_newest_release_is_the_package_version() -> None:
    assert releases()[1][0] == __version__
