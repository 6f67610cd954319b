#!/usr/bin/env bash
# Idempotent install of Debian's podman, buildah and runc for the OCI image (make image,
# deploy/image): `make image` builds with them and the image step of make test runs the image.
#
#  - installs whichever of podman, buildah and runc is missing via apt (apt-get update first)
#  - checks that podman answers with the repository's engine configuration
#    (deploy/image/containers.conf: runc as the runtime, explicit ulimits), never the machine's
#
# Safe to run any number of times.
set -euo pipefail

log() { printf 'podman-setup: %s\n' "$*"; }
die() { printf 'podman-setup: ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
	if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n -- "$@"; fi
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
missing=()
for tool in podman buildah runc; do
	command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]} > 0)); then
	log "missing ${missing[*]}; installing Debian's ${missing[*]} via apt"
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq || die "apt-get update failed"
	as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
		die "apt-get install ${missing[*]} failed"
	for tool in "${missing[@]}"; do
		command -v "$tool" >/dev/null 2>&1 || die "$tool installed but not on PATH"
	done
fi

export CONTAINERS_CONF="$root/deploy/image/containers.conf"
[[ -f "$CONTAINERS_CONF" ]] || die "$CONTAINERS_CONF is missing"
timeout 60 podman version --format '{{.Client.Version}}' >/dev/null || die "podman does not answer (CONTAINERS_CONF=$CONTAINERS_CONF)"
log "podman $(podman version --format '{{.Client.Version}}'), buildah $(buildah version 2>/dev/null | awk '/^Version:/ {print $2}'), $(runc --version | head -1)"
