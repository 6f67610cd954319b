#!/usr/bin/env bash
# Installs Debian's patroni when missing: deploy/local/cluster up --db-ha runs every region's
# database and the ledger as a Patroni cluster of two PostgreSQL nodes (its DCS is the
# cluster's own etcd). Patroni runs the PostgreSQL 15 binaries of /usr/lib/postgresql/15/bin
# (Debian's postgresql-15, which scripts/pg-setup.sh installs).
set -euo pipefail
have() {
	command -v patroni >/dev/null 2>&1 && [[ -x /usr/lib/postgresql/15/bin/pg_ctl ]]
}
if have; then
	echo "patroni-setup: $(patroni --version 2>&1 | head -1)"
	exit 0
fi
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo -n)
echo "patroni-setup: installing Debian's patroni (and postgresql-15)"
# apt-get update first: a fresh image's package lists may not name patroni yet.
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patroni postgresql-15 >/dev/null
have || {
	echo "patroni-setup: patroni or /usr/lib/postgresql/15/bin/pg_ctl still missing" >&2
	exit 1
}
echo "patroni-setup: $(patroni --version 2>&1 | head -1)"
