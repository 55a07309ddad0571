#!/usr/bin/env bash
# The whole test suite, several times in a row, while another process keeps one CPU busy:
# a test that passes only on an idle machine fails here. `make test-stress` runs it.
#
#   RUNS=3            how many full runs (default 3)
#   RUN_TIMEOUT=1500  seconds allowed per run before it counts as failed
#   PYTEST_ARGS=...   extra pytest arguments (e.g. a subset of files while iterating)
#   XDIST=...         the workers' arguments (`make test-stress` passes make test's own)
#
# Prints one summary line per run and the failing tests of a failed run; exits 1 if any run
# failed. The CPU burner is stopped however the script ends (trap).
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-1500}

"$PY" -c 'while True: pass' &
burner=$!
stop_burner() { kill "$burner" 2>/dev/null; wait "$burner" 2>/dev/null; }
trap stop_burner EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Byte-compiled once (as `make test` does): the processes the tests start import these modules.
"$PY" -m compileall -q daemon sdk webui_model benchmarks tests >/dev/null

failed=0
log=$(mktemp)
trap 'stop_burner; rm -f "$log"' EXIT
for run in $(seq 1 "$RUNS"); do
    started=$(date +%s)
    # shellcheck disable=SC2086 # XDIST and PYTEST_ARGS are lists of arguments
    timeout "$RUN_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider ${XDIST:--n auto} ${PYTEST_ARGS:-} >"$log" 2>&1
    rc=$?
    summary=$(tail -n 1 "$log" | tr -s '=' ' ' | sed 's/^ *//; s/ *$//')
    [ "$rc" -eq 124 ] && summary="timed out after ${RUN_TIMEOUT} s"
    echo "stress run $run/$RUNS: exit $rc: $summary ($(( $(date +%s) - started )) s, one CPU busy)"
    if [ "$rc" -ne 0 ]; then
        failed=$((failed + 1))
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
        kept="${TMPDIR:-/tmp}/turnkeeper-stress-run-$run.log"
        cp "$log" "$kept" && echo "    the whole output of run $run: $kept"
    fi
done
echo "stress: $((RUNS - failed)) of $RUNS full runs passed"
[ "$failed" -eq 0 ]
