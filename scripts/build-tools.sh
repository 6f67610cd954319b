#!/usr/bin/env bash
# Builds the pinned code-generation tools from tools/go.mod (buf,
# protoc-gen-go, protoc-gen-go-grpc) into .cache/tools/bin and prints that
# directory on stdout. Progress goes to stderr. Rebuilds only when
# tools/go.mod or tools/go.sum changed (or a binary is missing).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${QUOTA_TOOLS_BIN:-$ROOT/.cache/tools/bin}"
export PATH="/usr/local/go/bin:$PATH"

mkdir -p "$BIN"
stamp="$BIN/.stamp"
want="$(cat "$ROOT/tools/go.mod" "$ROOT/tools/go.sum" | sha256sum | cut -d' ' -f1) $(go env GOVERSION)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" &&
	-x "$BIN/buf" && -x "$BIN/protoc-gen-go" && -x "$BIN/protoc-gen-go-grpc" ]]; then
	echo "tools: up to date in $BIN" >&2
else
	echo "tools: building buf, protoc-gen-go, protoc-gen-go-grpc -> $BIN" >&2
	# `tool` is the go.mod tool meta-package (Go 1.24+). GOWORK=off keeps a
	# go.work in a parent directory from pulling in the main module.
	(cd "$ROOT/tools" && GOWORK=off go build -o "$BIN/" tool)
	echo "$want" >"$stamp"
fi
echo "$BIN"
