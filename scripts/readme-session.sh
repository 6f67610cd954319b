#!/usr/bin/env bash
# Runs the README's manual session as written: starts `quotad dev` (terminal 1) in a scratch
# directory, then runs every command of the README's terminal 2 block in order, exactly as
# the README has it, except the confirm's <hold_id>, which is replaced with the one the
# reserve printed (scripts/docs-examples.sh runs every other example of the docs). Fails on the first command that fails, or if the audit is not clean.
#
# It differs from the README in one way only: quotad dev gets a database prefix of its own
# (quota_readme_<random>), so it never touches a developer's quota_* databases; they are
# dropped at the end. It needs the README's default ports (7400-7403, 7490-7491) free.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="/usr/local/go/bin:$PATH"
PG_URL=${QUOTA_PG_URL:-postgres://quota:quota@127.0.0.1:5432/postgres}

say() { printf 'readme-session: %s\n' "$*"; }
die() { printf 'readme-session: %s\n' "$*" >&2; exit 1; }

[[ -x $ROOT/bin/quotad && -x $ROOT/bin/quotactl ]] || die "build first: make build"
for port in 7400 7401 7402 7403 7490 7491; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		die "port $port is in use (a quotad dev running?): the README's session needs it"
	fi
done

# The terminal 2 block: the first ``` block after "Terminal 2:", continuations joined,
# comments dropped.
mapfile -t CMDS < <(awk '
	/^Terminal 2:/ { t2 = 1; next }
	t2 && /^```/ { if (in_block) exit; in_block = 1; next }
	in_block {
		line = $0; sub(/[ \t]+#.*$/, "", line)
		if (line ~ /\\$/) { sub(/\\$/, "", line); acc = acc line; next }
		print acc line; acc = ""
	}' "$ROOT/README.md")
((${#CMDS[@]} >= 5)) || die "found ${#CMDS[@]} commands in the README's terminal 2 block; want its whole session"

WORK=$(mktemp -d)
PREFIX="quota_readme_$RANDOM$RANDOM"
QUOTAD=""
cleanup() {
	if [[ -n $QUOTAD ]]; then
		kill "$QUOTAD" 2>/dev/null || true
		wait "$QUOTAD" 2>/dev/null || true
	fi
	for db in coordinator region_us region_eu region_ap; do
		psql -X -q "$PG_URL" -c "DROP DATABASE IF EXISTS ${PREFIX}_$db" >/dev/null 2>&1 ||
			say "could not drop ${PREFIX}_$db (drop it by hand)"
	done
	rm -rf "$WORK"
}
trap cleanup EXIT
ln -s "$ROOT/bin" "$WORK/bin"
cd "$WORK"

say "terminal 1: ./bin/quotad dev (databases ${PREFIX}_*, in $WORK)"
./bin/quotad dev --db-prefix "$PREFIX" --pg-url "$PG_URL" >quotad.log 2>&1 &
QUOTAD=$!
for _ in $(seq 1 120); do
	if ./bin/quotactl --timeout 2s regions >/dev/null 2>&1; then break; fi
	kill -0 "$QUOTAD" 2>/dev/null || { cat quotad.log >&2; die "quotad dev exited"; }
	sleep 0.5
done

HOLD=""
for cmd in "${CMDS[@]}"; do
	if [[ $cmd == *" confirm "* ]]; then
		[[ -n $HOLD ]] || die "confirm before any reserve printed a hold id"
		cmd=$(sed -E "s/--hold [^ ]+/--hold $HOLD/" <<<"$cmd")
	fi
	say "terminal 2: $cmd"
	if ! out=$(bash -c "$cmd" 2>&1); then
		printf '%s\n' "$out" >&2
		die "failed: $cmd"
	fi
	printf '%s\n' "$out"
	if [[ $cmd == *" reserve "* ]]; then
		HOLD=$(grep -oE '"hold_id": *"[^"]+"' <<<"$out" | head -1 | sed -E 's/.*"([^"]+)"$/\1/')
	fi
	if [[ $cmd == *" audit "* ]] && [[ $out != *"audit ok"* ]]; then
		die "the audit is not clean"
	fi
done
say "ok: ${#CMDS[@]} commands as the README has them"
