#!/usr/bin/env bash
# Lints proto/ and regenerates the Go code next to the .proto files
# (proto/quota/v1/*.pb.go) with the tool versions pinned in tools/go.mod.
# Generation happens in a temporary copy; on success the *.pb.go files are
# synced back (and *.pb.go files whose .proto was removed are deleted).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$("$ROOT/scripts/build-tools.sh")"
export PATH="$BIN:$PATH"

cd "$ROOT/proto"
echo "proto: buf lint"
buf lint

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp -a "$ROOT/proto/." "$tmp/"
find "$tmp" -name '*.pb.go' -delete

echo "proto: buf generate"
(cd "$tmp" && buf generate)

# Remove orphaned generated files, then copy the fresh ones in.
while IFS= read -r f; do
	if [[ ! -f "$tmp/$f" ]]; then
		echo "proto: removing stale ${f#./}"
		rm -f "$ROOT/proto/$f"
	fi
done < <(find . -name '*.pb.go' -type f)
(cd "$tmp" && find . -name '*.pb.go' -type f) | while IFS= read -r f; do
	mkdir -p "$(dirname "$ROOT/proto/$f")"
	cmp -s "$tmp/$f" "$ROOT/proto/$f" || { echo "proto: updated ${f#./}"; cp "$tmp/$f" "$ROOT/proto/$f"; }
done
echo "proto: done"
