#!/usr/bin/env bash
# Idempotent install of redis-server (Debian's package) for `quotactl bench` variants (g) and
# (h) and their tests.
#
#  - installs redis-server via apt when the binary is missing
#  - stops and disables the system redis service the package may start: the bench starts its
#    own redis-server on a free loopback port in a scratch directory and never uses it
#
# Safe to run any number of times.
set -euo pipefail

log() { printf 'redis-setup: %s\n' "$*"; }
die() { printf 'redis-setup: ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
	if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n -- "$@"; fi
}

find_server() {
	command -v redis-server 2>/dev/null || { [[ -x /usr/bin/redis-server ]] && echo /usr/bin/redis-server; }
}

if bin="$(find_server)" && [[ -n "$bin" ]]; then
	log "redis-server already installed: $("$bin" --version | head -n1)"
	exit 0
fi

log "redis-server not found; installing via apt"
as_root apt-get update
# policy-rc.d exit 101 keeps the package's service from starting where invoke-rc.d honours it.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [[ ! -e "$policy" ]]; then
	as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy" && made_policy=1
fi
trap 'if [[ $made_policy == 1 ]]; then as_root rm -f "$policy"; fi' EXIT
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server

# Where the service started anyway (systemd), stop it and keep it from starting at boot.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
	as_root systemctl disable --now redis-server >/dev/null 2>&1 || true
elif command -v service >/dev/null 2>&1; then
	as_root service redis-server stop >/dev/null 2>&1 || true
fi

bin="$(find_server)" || die "apt did not install redis-server"
log "installed: $("$bin" --version | head -n1)"
