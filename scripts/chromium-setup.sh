#!/usr/bin/env bash
# Idempotent install of Debian's chromium for the web console's browser test
# (TestConsoleInABrowser, cmd/internal/cluster): a step of make test, so a fresh CI machine
# has the browser before the tests run (under CI=true the test fails without it).
#
#  - installs chromium via apt when no chromium is on PATH
#  - checks that it starts headless with the flags the test uses (the network is closed:
#    without them it stalls on background fetches)
#
# Safe to run any number of times.
set -euo pipefail

log() { printf 'chromium-setup: %s\n' "$*"; }
die() { printf 'chromium-setup: ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
	if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n -- "$@"; fi
}

find_browser() {
	command -v chromium 2>/dev/null || command -v chromium-browser 2>/dev/null || true
}

bin="$(find_browser)"
if [[ -z "$bin" ]]; then
	log "chromium not found; installing Debian's chromium via apt"
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq || die "apt-get update failed"
	as_root apt-get install -y -qq --no-install-recommends chromium >/dev/null || die "apt-get install chromium failed"
	bin="$(find_browser)"
	[[ -n "$bin" ]] || die "chromium installed but not on PATH"
fi

profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
dom="$(timeout 60 "$bin" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	--disable-background-networking --disable-component-update --disable-sync \
	--user-data-dir="$profile" --dump-dom 'data:text/html,<p>ok</p>' 2>/dev/null)" || die "$bin does not start headless"
[[ "$dom" == *"<p>ok</p>"* ]] || die "$bin started headless but rendered nothing"
log "using $bin: $("$bin" --version 2>/dev/null)"
