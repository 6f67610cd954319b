#!/usr/bin/env bash
# Installs Debian's etcd-client (etcdctl) when missing: the etcd lock-down test replays an
# attacker's writes with it, and deploy/local/cluster probes its etcd members with it.
set -euo pipefail
if command -v etcdctl >/dev/null 2>&1; then
	echo "etcdctl-setup: $(etcdctl version | head -1)"
	exit 0
fi
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo -n)
echo "etcdctl-setup: installing Debian's etcd-client"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-client >/dev/null 2>&1 || {
	"${sudo[@]}" apt-get update -qq
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-client >/dev/null
}
echo "etcdctl-setup: $(etcdctl version | head -1)"
