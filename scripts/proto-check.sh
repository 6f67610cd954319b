#!/usr/bin/env bash
# Regenerates proto/ into a temporary copy and compares the *.pb.go files with
# the committed ones. Exits 1 if anything differs (content, missing or extra).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$("$ROOT/scripts/build-tools.sh")"
export PATH="$BIN:$PATH"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cp -a "$ROOT/proto/." "$tmp/"
# Drop the committed output so stale files for deleted .proto sources show up.
find "$tmp" -name '*.pb.go' -delete

echo "proto-check: buf generate into $tmp"
(cd "$tmp" && buf generate)

list() { (cd "$1" && find . -name '*.pb.go' -type f | LC_ALL=C sort); }

stale=0
if ! diff -u --label committed --label generated <(list "$ROOT/proto") <(list "$tmp"); then
	echo "proto-check: set of generated files differs" >&2
	stale=1
fi
while IFS= read -r f; do
	[[ -f "$ROOT/proto/$f" ]] || continue
	if ! diff -u --label "committed: proto/${f#./}" --label "generated: proto/${f#./}" \
		"$ROOT/proto/$f" "$tmp/$f"; then
		stale=1
	fi
done < <(list "$tmp")

if ((stale)); then
	echo "proto-check: FAIL: generated code is stale: run make proto" >&2
	exit 1
fi
echo "proto-check: ok ($(list "$tmp" | wc -l) files up to date)"
