#!/usr/bin/env bash
# Runs every shell example of README.md and docs/*.md that calls quotactl or curl, against a
# fresh `quotad dev` per document, so that a documented command cannot rot.
#
# An example is a ``` block (indented in a list or not) with at least one line starting with `quotactl`, `./bin/quotactl`
# or `curl` (after an optional `$ ` prompt). In a block with `$ ` prompts only the prompted
# lines are commands (the rest is their output; an `HTTP/x NNN` line right after a command is
# the status it must answer); in a block without prompts every line is a command. Commands
# run in order, one document at a time, in a scratch directory that holds quotad dev's
# .dev/certs, with bin/ on PATH; `NAME=value` lines carry over to the document's later
# commands. Every command must exit 0.
#
# Placeholders: `<name>` in a command is replaced by the last `"name": "value"` string an
# earlier command of the same document printed (`<hold_id>` from a reserve, `<admission_id>`
# from entering a waiting room, `<ticket>` from an admitted poll), or by the last header of
# that name a `curl -i` printed (`<etag>`, `-` read as `_`). A poll of an admission
# still `queued` (or `admitted` where the document shows a 409: its binding answered another
# region later) is repeated until it is not (at most 10 s).
#
# Markers, HTML comments in the document itself:
#   <!-- examples: skip: REASON -->   on the line before a block: the block is not run (and
#                                     is counted and listed with its reason)
#   <!-- examples: setup: COMMAND --> runs COMMAND at that point of the document (a sale the
#                                     examples below assume, made by another document)
#
# Each quotad dev gets a database prefix of its own (quota_docs_<random>); the databases are
# dropped at the end. It needs quotad dev's default ports (7400-7403, 8400-8403, 7490-7491)
# free. Usage: scripts/docs-examples.sh [FILE.md ...] (default: README.md docs/*.md, after
# checking that docs/reliability.md's fuzz table names exactly the Makefile's FUZZ_TARGETS).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="/usr/local/go/bin:$PATH"
PG_URL=${QUOTA_PG_URL:-postgres://quota:quota@127.0.0.1:5432/postgres}

say() { printf 'docs-examples: %s\n' "$*"; }
die() { printf 'docs-examples: %s\n' "$*" >&2; exit 1; }

[[ -x $ROOT/bin/quotad && -x $ROOT/bin/quotactl ]] || die "build first: make build"
for port in 7400 7401 7402 7403 8400 8401 8402 8403 7490 7491; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		die "port $port is in use (a quotad dev running?): the examples need it"
	fi
done

# extract FILE: one record a line, tab-separated:
#   B <line> <skip reason or empty>   a block with commands
#   C <command> <expected HTTP status or empty>
#   S <command>                       a setup marker
extract() {
	awk '
	function flush() { if (acc != "") { print "C\t" acc "\t" expect; acc = ""; expect = "" } }
	function addline(line) {
		sub(/[ \t]+#.*$/, "", line)
		if (line ~ /^[ \t]*#/ || line ~ /^[ \t]*$/) return
		if (inloop) {
			sub(/^[ \t]+/, "", line)
			acc = acc (acc ~ /do$/ ? " " : "; ") line
			if (line ~ /^done/) { inloop = 0; pending = 0 }
			return
		}
		if (pending) { sub(/^[ \t]+/, "", line); acc = acc " " line } else { flush(); acc = line }
		pending = 0
		if (acc ~ /\\$/) { sub(/[ \t]*\\$/, "", acc); pending = 1 }
		if (acc ~ /^for /) inloop = 1
	}
	/^ *<!-- examples: setup: / {
		s = $0; sub(/^ *<!-- examples: setup: /, "", s); sub(/ *-->.*$/, "", s); print "S\t" s; next
	}
	!inb && /^ *```/ {
		inb = 1; n = 0; start = FNR; skip = ""; match($0, /^ */); indent = RLENGTH
		if (prev ~ /^ *<!-- examples: skip: /) { skip = prev; sub(/^ *<!-- examples: skip: /, "", skip); sub(/ *-->.*$/, "", skip) }
		next
	}
	inb && /^ *```/ {
		inb = 0; has = 0; dollar = 0
		for (i = 1; i <= n; i++) {
			if (L[i] ~ /^(\$ )?(\.\/bin\/)?(quotactl|curl)( |$)/) has = 1
			if (L[i] ~ /^\$ /) dollar = 1
		}
		if (has) {
			print "B\t" start "\t" skip
			acc = ""; expect = ""; pending = 0; inloop = 0
			for (i = 1; i <= n; i++) {
				if (!dollar) { addline(L[i]); continue }
				if (L[i] ~ /^\$ /) { flush(); addline(substr(L[i], 3)); continue }
				if (pending) { addline(L[i]); continue }
				if (acc != "" && expect == "" && L[i] ~ /^HTTP\/[0-9.]+ [0-9]+/) { split(L[i], w, " "); expect = w[2] }
				flush()
			}
			flush()
		}
		prev = ""; next
	}
	inb { line = $0; for (i = 0; i < indent && substr(line, 1, 1) == " "; i++) line = substr(line, 2); L[++n] = line; next }
	/[^ \t]/ { prev = $0 }
	' "$1"
}

WORK=""
QUOTAD=""
PREFIX=""
PREFIXES=()
stop_quotad() {
	if [[ -n $QUOTAD ]]; then
		kill "$QUOTAD" 2>/dev/null || true
		wait "$QUOTAD" 2>/dev/null || true
		QUOTAD=""
	fi
}
cleanup() {
	stop_quotad
	for p in "${PREFIXES[@]}"; do
		for db in coordinator region_us region_eu region_ap; do
			psql -X -q "$PG_URL" -c "DROP DATABASE IF EXISTS ${p}_$db" >/dev/null 2>&1 ||
				say "could not drop ${p}_$db (drop it by hand)"
		done
	done
	[[ -z $WORK ]] || rm -rf "$WORK"
}
trap cleanup EXIT
WORK=$(mktemp -d)
# curl without its progress meter (what it prints on a terminal), errors still shown
printf -- '--silent\n--show-error\n' >"$WORK/.curlrc"
export CURL_HOME=$WORK

start_quotad() { # $1: directory
	PREFIX="quota_docs_$RANDOM$RANDOM"
	PREFIXES+=("$PREFIX")
	(cd "$1" && exec "$ROOT/bin/quotad" dev --db-prefix "$PREFIX" --pg-url "$PG_URL" >quotad.log 2>&1) &
	QUOTAD=$!
	for _ in $(seq 1 120); do
		if (cd "$1" && "$ROOT/bin/quotactl" --timeout 2s regions >/dev/null 2>&1); then return 0; fi
		kill -0 "$QUOTAD" 2>/dev/null || { cat "$1/quotad.log" >&2; die "quotad dev exited"; }
		sleep 0.5
	done
	die "quotad dev did not answer within 60 s"
}

# fill CMD: replaces each <name> with the value captured under that name.
declare -A VALS
fill() {
	local cmd=$1 ph name
	while ph=$(grep -oE '<[a-z_]+>' <<<"$cmd" | head -1) && [[ -n $ph ]]; do
		name=${ph:1:${#ph}-2}
		[[ -n ${VALS[$name]:-} ]] || return 1
		cmd=${cmd//"$ph"/"${VALS[$name]}"}
	done
	printf '%s' "$cmd"
}

capture() { # $1: output; records every "name": "value" it prints
	local kv k v
	while IFS= read -r kv; do
		k=${kv#\"}; k=${k%%\"*}
		v=${kv#*:}; v=${v#"${v%%[! ]*}"}; v=${v#\"}; v=${v%\"}
		VALS[$k]=$v
	done < <(grep -oE '"[a-z_]+": ?"[^"]*"' <<<"$1" || true)
	# and the headers `curl -i` prints (`etag: "…"` as <etag>)
	while IFS= read -r kv; do
		kv=${kv%$'\r'}; k=${kv%%:*}; VALS[${k//-/_}]=${kv#*: }
	done < <(grep -E '^[a-z-]+: ' <<<"$1" || true)
}

ASSIGN='^[A-Za-z_][A-Za-z0-9_]*=("[^"]*"|'"'"'[^'"'"']*'"'"'|[^ ]*)$'
RAN=0
SKIPPED=0
SKIPS=()
run_doc() { # $1: path relative to ROOT
	local doc=$1 dir kind a b cmd out expect pre="" tries
	mapfile -t RECS < <(extract "$ROOT/$doc")
	local any=0
	for r in "${RECS[@]}"; do [[ $r == C* ]] && any=1; done
	((any)) || return 0
	dir="$WORK/${doc//\//_}"
	mkdir -p "$dir/bin"
	ln -s "$ROOT/bin/quotactl" "$ROOT/bin/quotad" "$dir/bin/"
	VALS=()
	local skip="" started=0
	for r in "${RECS[@]}"; do
		IFS=$'\t' read -r kind a b <<<"$r"
		case $kind in
		B)
			skip=$b
			if [[ -n $skip ]]; then
				SKIPPED=$((SKIPPED + 1))
				SKIPS+=("$doc:$a: $skip")
				say "$doc:$a: not run: $skip"
			fi
			continue ;;
		S) cmd=$a; expect="" ;;
		C) [[ -z $skip ]] || continue; cmd=$a; expect=$b ;;
		esac
		if ((!started)); then
			say "$doc: quotad dev (databases quota_docs_*, in $dir)"
			start_quotad "$dir"
			started=1
		fi
		cmd=$(fill "$cmd") || die "$doc: no earlier output gave a value for a placeholder of: $a"
		if [[ $cmd =~ $ASSIGN ]]; then
			pre+="$cmd"$'\n'
		fi
		say "$doc: $cmd"
		for tries in $(seq 1 40); do
			if ! out=$(cd "$dir" && PATH="$dir/bin:$PATH" bash -c "set -euo pipefail; $pre$cmd" 2>&1); then
				printf '%s\n' "$out" >&2
				die "$doc: failed: $cmd"
			fi
			# queued; or admitted where the doc shows 409 (a room that has not heard the
			# buyer's binding within its wait admits, then withdraws: docs/storefront.md)
			[[ $cmd == curl* && $cmd == */admissions/* && $cmd != *" -d "* && $cmd != *--json* &&
				($out == *'"state":"queued"'* || ($expect == 409 && $out == *'"state":"admitted"'*)) ]] || break
			sleep 0.25
		done
		printf '%s\n' "${out:0:2000}"
		if [[ -n $expect ]]; then
			got=$(head -1 <<<"$out" | awk '/^HTTP\// { print $2 }')
			[[ $got == "$expect" ]] || die "$doc: the doc shows HTTP $expect after this command, it answered ${got:-no status}: $cmd"
		fi
		if [[ $cmd == *"quotactl audit"* && $out != *"audit ok"* ]]; then
			die "$doc: the audit is not clean"
		fi
		capture "$out"
		[[ $kind == S ]] || RAN=$((RAN + 1))
	done
	stop_quotad
}

# The fuzz targets the docs list are the ones `make fuzz` runs: reliability.md's table is
# their one home, and it must name every target of the Makefile's FUZZ_TARGETS and no other.
check_fuzz_table() {
	local want got
	want=$(make -s -C "$ROOT" --no-print-directory -pn fuzz 2>/dev/null | sed -n 's/^FUZZ_TARGETS := //p' |
		tr ' ' '\n' | sed -n 's/:.*//p' | sort)
	got=$(grep -oE '^\| `Fuzz[A-Za-z]+` \|' "$ROOT/docs/reliability.md" | grep -oE 'Fuzz[A-Za-z]+' | sort)
	[[ -n $want ]] || die "could not read FUZZ_TARGETS from the Makefile"
	[[ $want == "$got" ]] || die "docs/reliability.md's fuzz table lists [$(echo $got)], the Makefile's FUZZ_TARGETS [$(echo $want)]"
	say "docs/reliability.md lists the $(wc -l <<<"$want") fuzz targets of FUZZ_TARGETS"
}

if (($# == 0)); then
	check_fuzz_table
	set -- README.md $(cd "$ROOT" && ls docs/*.md)
fi
for doc in "$@"; do
	run_doc "$doc"
done
say "ok: $RAN commands run, $SKIPPED blocks not run (each marked in its document with the reason):"
for s in "${SKIPS[@]}"; do say "  $s"; done
