#!/usr/bin/env bash
# run-tests.sh N ARGS...: `go test -v ARGS...`, and fail unless exactly N tests passed and none
# was skipped, so a step of `make test` that names its tests cannot turn green by running none
# (a test renamed or moved, or one that skipped itself).
set -uo pipefail
want=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"${GO:-go}" test -v "$@" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
passed=$(grep -c -- '^--- PASS: Test' "$out")
skipped=$(grep -c -- '--- SKIP: Test' "$out")
if [ "$status" -ne 0 ]; then
	exit "$status"
fi
if [ "$passed" -ne "$want" ] || [ "$skipped" -ne 0 ]; then
	echo "run-tests: $passed tests passed and $skipped skipped; want exactly $want passed and none skipped" >&2
	exit 1
fi
