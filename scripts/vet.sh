#!/usr/bin/env bash
# gofmt check (generated *.pb.go, testdata and tool/state dirs excluded), then go vet ./...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="/usr/local/go/bin:$PATH"

mapfile -t files < <(find . \( -path ./.git -o -path ./.cache -o -path ./.dev -o -path ./.cluster \
	-o -path ./bin -o -path ./vendor -o -name testdata \) -prune -o \
	-type f -name '*.go' ! -name '*.pb.go' -print | LC_ALL=C sort)

fmt_ok=1
if ((${#files[@]})); then
	unformatted="$(gofmt -l "${files[@]}")"
	if [[ -n "$unformatted" ]]; then
		echo "vet: gofmt: these files need formatting (run gofmt -w <file>):" >&2
		sed 's/^/  /' <<<"$unformatted" >&2
		fmt_ok=0
	else
		echo "vet: gofmt ok (${#files[@]} files)"
	fi
fi

echo "vet: go vet ./..."
vet_ok=1
go vet ./... || vet_ok=0

word() { if (($1)); then echo ok; else echo FAIL; fi; }
((fmt_ok && vet_ok)) || { echo "vet: FAIL (gofmt: $(word $fmt_ok), go vet: $(word $vet_ok))" >&2; exit 1; }
echo "vet: ok"
