"""Mutation testing of the pure cores, one module at a time (`make mutation`).

For each core module this script builds a private workspace under ``.mutation/<module>/``
(a snapshot of the packages and the tests, plus a ``[tool.mutmut]`` section restricting
mutation to that one file and the test run to the fast unit tests mapped to it), runs
``mutmut run`` there, and reads the verdicts back from mutmut's ``.meta`` files. The
table printed at the end (and written to ``.mutation/summary.md``) gives, per module,
how many mutants were generated, killed, survived, timed out or were not reached by any
mapped test, and the score: (killed + timeout) / mutants.

Only the pure-core unit tests run here, never the integration tests that start daemons.
Equivalent mutants (mutations that cannot change observable behaviour) are excluded in
the source with a ``# pragma: no mutate`` comment and a reason next to it.

Usage:
    python tests/mutation.py                      # every core module
    python tests/mutation.py daemon/core/envelope.py   # just the named modules
    python tests/mutation.py --workers 2 --show-survivors
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".mutation"

# The packages copied into each workspace (importable from mutmut's `mutants/` tree).
PACKAGES = ("daemon", "sdk", "webui_model", "benchmarks")

# Core module -> the fast unit-test files that exercise it. The edge tests of the module's
# stem (EDGES, written to kill mutants) are added unless --baseline.
EDGES: dict[str, tuple[str, ...]] = {
    "acp_codec": ("acp/test_acp_codec_edges.py",),
    "compactor": ("daemon/test_compactor_edges.py",),
    "cursor": ("protocol/test_cursor_edges.py",),
    "envelope": ("daemon/test_envelope_core_edges.py",),
    "events": ("protocol/test_events_edges.py",),
    "guards": ("daemon/test_guards_edges.py",),
    "live_journal": ("daemon/test_live_journal_edges.py",),
    "pagination": ("webui/test_pagination_edges.py",),
    "protocol_envelope": ("protocol/test_envelope_edges.py",),
    "reducer": ("webui/test_reducer_edges.py",),
    "repair": ("sdk/test_repair_rules_edges.py",),
    "repair_commit": ("webui/test_repair_commit_edges.py",),
    "replay": ("webui/test_replay_edges.py",),
    "replay_window": ("daemon/test_replay_window_edges.py",),
    "restore": ("durability/test_restore_edges.py",),
    "ring": ("streams/test_ring_resume_edges.py",),
    "sse": ("protocol/test_sse_parser_edges.py",),
    "sse_encoder": ("protocol/test_sse_encoder_edges.py",),
    "store": ("webui/test_store_edges.py",),
    "subscriber": ("streams/test_subscriber_edges.py",),
    "terminals": ("protocol/test_terminals_edges.py",),
    "transcript_store": ("durability/test_transcript_store_edges.py",),
    "truncation": ("protocol/test_truncation_edges.py",),
}
TESTS: dict[str, tuple[str, ...]] = {
    "daemon/core/envelope.py": ("daemon/test_envelope_core.py",),
    "daemon/core/live_journal.py": ("daemon/test_live_journal.py", "daemon/test_live_journal_props.py"),
    "daemon/core/compactor.py": ("daemon/test_compactor.py",),
    "daemon/core/acp_codec.py": ("acp/test_acp_codec.py",),
    "daemon/core/acp_client.py": ("acp/test_acp_client.py",),
    "sdk/_truncation.py": ("sdk/test_truncation_text.py", "sdk/test_sdk_events.py"),
    "sdk/protocol/sse.py": ("protocol/test_sse_parser.py", "protocol/test_sse_encoder_edges.py"),
    # The marker and payload rules (moved here from the SDK's truncation and events modules).
    # The events package: the payload Structs, history_truncated's rules, the ACP update kinds
    # and the frame decoders (one module each).
    "sdk/protocol/events/_payloads.py": (
        "sdk/test_sdk_events.py", "protocol/test_protocol.py", "protocol/test_events_edges.py",
    ),
    "sdk/protocol/events/_history_truncated.py": (
        "sdk/test_truncation_text.py", "sdk/test_sdk_events.py", "protocol/test_protocol.py", "protocol/test_truncation_edges.py",
    ),
    "sdk/protocol/events/_updates.py": (
        "sdk/test_sdk_events.py", "protocol/test_protocol.py", "protocol/test_events_edges.py",
    ),
    "sdk/protocol/events/_codec.py": (
        "sdk/test_sdk_events.py", "protocol/test_protocol.py", "protocol/test_events_edges.py",
        "protocol/test_envelope_edges.py",
    ),
    # The envelope (frame bytes -> DaemonEvent, and back), the resume cursor and the prompt
    # terminals (all moved into sdk/protocol/ with the marker rules).
    "sdk/protocol/envelope.py": (
        "protocol/test_protocol.py", "sdk/test_sdk_events.py", "protocol/test_sse_parser.py", "protocol/test_envelope_edges.py",
    ),
    "sdk/protocol/cursor.py": ("protocol/test_protocol.py",),
    "sdk/protocol/terminals.py": ("protocol/test_protocol.py", "webui/test_webui_terminals.py"),
    "sdk/_repair.py": ("sdk/test_repair_rules.py",),
    "webui_model/store.py": (
        "webui/test_webui_store.py", "webui/test_webui_reducer.py", "webui/test_webui_replay.py",
        "webui/test_webui_repair_commit.py",
    ),
    # The store's state value and draft (split out of store.py).
    "webui_model/draft.py": (
        "webui/test_webui_store.py", "webui/test_webui_reducer.py", "webui/test_webui_replay.py",
        "webui/test_webui_repair_commit.py",
    ),
    "webui_model/reducer.py": (
        "webui/test_webui_reducer.py", "webui/test_webui_store.py", "webui/test_webui_replay.py",
        "webui/test_webui_repair_commit.py",
    ),
    "webui_model/replay.py": ("webui/test_webui_replay.py",),
    "webui_model/pagination.py": ("webui/test_webui_replay.py",),
    "webui_model/repair_commit.py": ("webui/test_webui_repair_commit.py",),
    "daemon/core/replay_window.py": ("daemon/test_replay_window.py",),
    "daemon/core/ring.py": ("streams/test_ring_resume.py", "daemon/test_guards_subscriber_restore.py"),
    "daemon/core/subscriber.py": (
        "daemon/test_guards_subscriber_restore.py", "streams/test_ring_resume.py", "streams/test_subscriber_replay.py",
    ),
    "daemon/core/guards.py": ("daemon/test_guards_subscriber_restore.py",),
    "daemon/core/restore.py": ("daemon/test_guards_subscriber_restore.py", "durability/test_restore_terminals.py"),
    "daemon/transcript_store/_writes.py": ("durability/test_transcript_store.py",),
    "daemon/transcript_store/_reads.py": ("durability/test_transcript_store.py",),
    "daemon/transcript_store/_schema.py": (
        "durability/test_transcript_store.py", "durability/test_transcript_checks.py",
    ),
    "daemon/core/idempotency.py": ("daemon/test_idempotency_core.py",),
    "daemon/core/checksum.py": ("durability/test_transcript_checks.py",),
}

# Tests too slow to run once per mutant (they measure scale, not logic; the same logic is
# covered by the small tests in the same files).
DESELECT = ("tests/webui/test_webui_repair_commit.py::test_repair_on_a_200k_history_with_a_10k_live_journal_shares_blocks",)

# Equivalent mutants, excluded by source line (mutmut's `do_not_mutate_patterns`: every
# mutation on a matching line is skipped). module -> [(line regex, why no mutation of it can
# change observable behaviour)].
EQUIVALENT: dict[str, list[tuple[str, str]]] = {
    "daemon/core/live_journal.py": [
        (r'_push\(event, None, ""\)$',
         "the text argument is read only to merge, and a None key never merges"),
        (r"^\s+self\._last_key(: MergeKey \| None)? = None$",
         "reset/init with no entries: any non-tuple sentinel equals no chunk's merge key"),
        (r'return "<missing>"$', "repr of the internal sentinel, a debugging aid never output"),
        (r"^\s+merged = False$", "_push's `merged` flag is only tested for truth"),
    ],
    "daemon/core/compactor.py": [
        (r'^\s+self\.(event_id|prompt_id|originator): Any = env\.get\("(id|promptId|originatorClientId)"\)$',
         "a tool slot's first id/promptId/originator: emit() starts from a copy of that same "
         "first envelope and only overrides with later non-null values, so None is the same"),
        (r"^\s+self\.last_env: JsonObject = \{\}$",
         "a text slot is created only to absorb a chunk at once, which sets last_env"),
    ],
    "sdk/protocol/sse.py": [
        (r"^\s+pos = len\(buf\)$",
         "where feed() resumes its newline search is an optimisation: the buffered part holds "
         "no newline, so searching from the start finds the same one"),
        (r"^\s+self\._closed = False$", "the parser's `_closed` flag is only tested for truth"),
        (r"^\s+self\._at_start = False$", "the parser's `_at_start` flag is only tested for truth"),
    ],
    "sdk/protocol/events/_codec.py": [
        (r"^\s+typed: AcpUpdate \| None = None$",
         "decode_payload's first value of `typed` is never read: the try block assigns it or "
         "its except clause sets it to None"),
    ],
    "daemon/core/restore.py": [
        (r'^\s+marker = Event\.from_env\(\{"v": 1, "type": "restore_boundary", "data": None\}\)$',
         "the between-turns marker only ends the compaction and is dropped at once "
         "(`[:-1]`): its contents never reach a record"),
    ],
    "daemon/core/acp_codec.py": [
        (r"^\s+self\._discarding = False$", "the splitter's `_discarding` flag is only tested for truth"),
    ],
}

# Modules whose SQL statements are string literals: a surviving mutant that only changes the
# letter case of an SQL line is equivalent (SQLite keywords and identifiers are
# case-insensitive) and is left out of the score. Found per survivor from its diff.
SQL_CASE_MODULES = frozenset({"daemon/transcript_store/_writes.py",
                              "daemon/transcript_store/_reads.py",
                              "daemon/transcript_store/_schema.py"})
_SQL_WORDS = re.compile(
    r"\b(select|insert|update|delete|from|where|order by|values|create|pragma|begin|commit"
    r"|rollback|on conflict|excluded|coalesce|asc|desc)\b|for table in \(",
    re.IGNORECASE,
)

# mutmut exit code -> verdict (the tool's own mapping, grouped for the table).
KILLED_CODES = {1, 3, 37}
SURVIVED_CODES = {0}
TIMEOUT_CODES = {36, 24, -24, 152, 255}
NO_TESTS_CODES = {5, 33}


@dataclass
class Score:
    module: str
    mutants: int = 0
    killed: int = 0
    survived: int = 0
    timeout: int = 0
    no_tests: int = 0
    other: int = 0
    equivalent: int = 0
    """Survivors recognised as equivalent after the run (left out of ``mutants``)."""
    seconds: float = 0.0

    @property
    def percent(self) -> float:
        return 100.0 * (self.killed + self.timeout) / self.mutants if self.mutants else 100.0


def test_files(module: str, *, baseline: bool = False) -> list[str]:
    files = [f"tests/{name}" for name in TESTS[module]]
    if baseline:
        return files
    stem = {"draft": "store"}.get(Path(module).stem, Path(module).stem)
    files += [f"tests/{name}" for name in EDGES.get(stem, ())]
    return files


def mutmut_section(module: str, baseline: bool) -> str:
    args = ["-p", "no:cacheprovider", "-q"]
    for node in DESELECT:
        args += ["--deselect", node]
    return "\n".join(
        [
            "",
            "[tool.mutmut]",
            f"source_paths = {json.dumps(list(PACKAGES))}",
            f"only_mutate = {json.dumps([module])}",
            f"pytest_add_cli_args = {json.dumps(args)}",
            f"pytest_add_cli_args_test_selection = {json.dumps(test_files(module, baseline=baseline))}",
            "use_git_change_detection = false",
            # A mutant whose tests run 10x longer than the clean run (plus 5 s) is an endless
            # loop: a timeout (detected). Generous: on a loaded machine wall time is not CPU time.
            "timeout_multiplier = 10.0",
            "timeout_constant = 5.0",
            f"do_not_mutate_patterns = {json.dumps([rx for rx, _ in EQUIVALENT.get(module, [])])}",
            "",
        ]
    )


def prepare(module: str, workdir: Path, baseline: bool) -> None:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    for package in (*PACKAGES, "tests"):
        shutil.copytree(ROOT / package, workdir / package, ignore=ignore)
    pyproject = (ROOT / "pyproject.toml").read_text("utf-8")
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("pyproject.toml must not carry a [tool.mutmut] section: this script writes one")
    (workdir / "pyproject.toml").write_text(pyproject + mutmut_section(module, baseline), "utf-8")


def collect(module: str, workdir: Path) -> Score:
    score = Score(module)
    meta = workdir / "mutants" / (module + ".meta")
    if not meta.exists():
        return score
    codes: dict[str, int | None] = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
    for code in codes.values():
        score.mutants += 1
        if code in KILLED_CODES:
            score.killed += 1
        elif code in SURVIVED_CODES:
            score.survived += 1
        elif code in TIMEOUT_CODES:
            score.timeout += 1
        elif code in NO_TESTS_CODES:
            score.no_tests += 1
        else:
            score.other += 1
    return score


def survivors(workdir: Path, module: str) -> list[str]:
    meta = workdir / "mutants" / (module + ".meta")
    if not meta.exists():
        return []
    codes: dict[str, int | None] = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
    return sorted(name for name, code in codes.items() if code not in KILLED_CODES | TIMEOUT_CODES)


def run_module(module: str, workers: int, show: bool, baseline: bool) -> Score:
    workdir = OUT / module.removesuffix(".py").replace("/", ".")
    prepare(module, workdir, baseline)
    env = dict(os.environ, HYPOTHESIS_PROFILE=os.environ.get("HYPOTHESIS_PROFILE", "mutation"))
    log = workdir / "mutmut.log"
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(workers)],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    score = collect(module, workdir)
    score.seconds = time.monotonic() - started
    if proc.returncode != 0 or score.mutants == 0:
        print(f"  mutmut failed for {module} (exit {proc.returncode}); see {log.relative_to(ROOT)}")
        score.other = max(score.other, 1)
    names = survivors(workdir, module)
    if module in SQL_CASE_MODULES and names:
        equivalent = sql_case_mutants(workdir, module, names)
        score.equivalent = len(equivalent)
        codes = json.loads((workdir / "mutants" / (module + ".meta")).read_text("utf-8"))
        for name in equivalent:
            if codes["exit_code_by_key"][name] in SURVIVED_CODES:
                score.survived -= 1
            else:
                score.no_tests -= 1
        score.mutants -= len(equivalent)
        names = [n for n in names if n not in equivalent]
        (workdir / "equivalent.txt").write_text("".join(f"{n}\n" for n in equivalent), "utf-8")
    (workdir / "survivors.txt").write_text("".join(f"{n}\n" for n in names), "utf-8")
    if show and names:
        # One process for all the diffs (`mutmut show` per mutant re-reads everything).
        subprocess.run(
            [sys.executable, "-c", _SHOW_DIFFS, module, *names],
            cwd=workdir,
            stdout=(workdir / "survivors.diff").open("w"),
            stderr=subprocess.STDOUT,
            check=False,
        )
    return score


def sql_case_mutants(workdir: Path, module: str, names: list[str]) -> set[str]:
    """The survivors among ``names`` whose mutation only changes the case of an SQL line."""
    out = subprocess.run(
        [sys.executable, "-c", _CHANGED_LINES, module, *names],
        cwd=workdir, capture_output=True, text=True, check=False,
    ).stdout
    found: set[str] = set()
    for line in out.splitlines():
        name, _, rest = line.partition("\t")
        before, _, after = rest.partition("\t")
        if before != after and before.lower() == after.lower() and _SQL_WORDS.search(before):
            found.add(name)
    return found


_CHANGED_LINES = """
import sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
for name in sys.argv[2:]:
    lines = get_diff_for_mutant(name, path=sys.argv[1]).splitlines()
    minus = [l[1:] for l in lines if l.startswith("-") and not l.startswith("---")]
    plus = [l[1:] for l in lines if l.startswith("+") and not l.startswith("+++")]
    if len(minus) == len(plus) == 1:
        print(name, minus[0], plus[0], sep="\\t")
"""


_SHOW_DIFFS = """
import sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
for name in sys.argv[2:]:
    print("#", name)
    print(get_diff_for_mutant(name, path=sys.argv[1]))
"""


def table(scores: list[Score]) -> str:
    head = ("| module | mutants | killed | survived | timeout | no tests | equivalent "
            "| score % | time s |")
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    rows = [
        f"| {s.module} | {s.mutants} | {s.killed} | {s.survived} | {s.timeout} | {s.no_tests} "
        f"| {s.equivalent} | {s.percent:.1f} | {s.seconds:.0f} |"
        for s in scores
    ]
    total = Score("**total**")
    for s in scores:
        total.mutants += s.mutants
        total.killed += s.killed
        total.survived += s.survived
        total.timeout += s.timeout
        total.no_tests += s.no_tests
        total.equivalent += s.equivalent
        total.seconds += s.seconds
    rows.append(
        f"| {total.module} | {total.mutants} | {total.killed} | {total.survived} | {total.timeout} "
        f"| {total.no_tests} | {total.equivalent} | {total.percent:.1f} | {total.seconds:.0f} |"
    )
    return "\n".join([head, rule, *rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("modules", nargs="*", help="core modules to run (default: all)")
    parser.add_argument("--workers", type=int, default=1, help="mutmut worker processes (default 1)")
    parser.add_argument("--show-survivors", action="store_true", help="write survivors.diff per module")
    parser.add_argument(
        "--baseline", action="store_true",
        help="leave out the edge tests (EDGES: the score of the suite without them)",
    )
    parser.add_argument("--min-score", type=float, default=90.0, help="fail below this score")
    args = parser.parse_args()
    modules = args.modules or list(TESTS)
    unknown = [m for m in modules if m not in TESTS]
    if unknown:
        parser.error(f"not a core module: {', '.join(unknown)}")
    scores = []
    for module in modules:
        print(f"mutating {module} with {', '.join(test_files(module, baseline=args.baseline))} ...", flush=True)
        score = run_module(module, args.workers, args.show_survivors, args.baseline)
        print(
            f"  {score.killed + score.timeout}/{score.mutants} killed ({score.percent:.1f}%) "
            f"in {score.seconds:.0f} s",
            flush=True,
        )
        scores.append(score)
    report = table(scores)
    print()
    print(report)
    OUT.mkdir(exist_ok=True)
    (OUT / "summary.md").write_text(report + "\n", "utf-8")
    failed = [s.module for s in scores if s.other or s.percent < args.min_score]
    if failed:
        print(f"\nbelow {args.min_score:.0f}% or failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
