#!/usr/bin/env bash
# Idempotent local PostgreSQL setup for tests and the demo.
#
#  - installs PostgreSQL via apt when no server is installed
#  - creates/starts a cluster (whatever major version is installed)
#  - waits until it accepts connections
#  - ensures role quota/quota (LOGIN CREATEDB)
#  - ensures max_connections >= 300 (tests open many databases in parallel)
#  - verifies password auth over TCP on 127.0.0.1:5432
#
# Safe to run any number of times.
set -euo pipefail

PG_ROLE=quota
PG_PASSWORD=quota
PG_PORT=5432
MIN_MAX_CONNECTIONS=300
WAIT_SECONDS=30

log() { printf 'pg-setup: %s\n' "$*"; }
die() { printf 'pg-setup: ERROR: %s\n' "$*" >&2; exit 1; }

# Run a command as the postgres OS user.
as_postgres() {
	if [[ "$(id -un)" == postgres ]]; then
		"$@"
	elif [[ "$(id -u)" -eq 0 ]]; then
		if command -v runuser >/dev/null 2>&1; then
			runuser -u postgres -- "$@"
		else
			su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
		fi
	else
		sudo -n -u postgres -- "$@"
	fi
}

as_root() {
	if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n -- "$@"; fi
}

server_installed() {
	command -v pg_ctlcluster >/dev/null 2>&1 &&
		command -v pg_lsclusters >/dev/null 2>&1 &&
		compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

# --- 1. install ---------------------------------------------------------------
if server_installed; then
	log "postgresql server already installed"
else
	log "postgresql server not found; installing via apt"
	as_root apt-get update
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
	server_installed || die "postgresql installation did not provide pg_ctlcluster/postgres"
fi

# --- 2. pick (or create) a cluster ------------------------------------------
# pg_lsclusters -h columns: Ver Cluster Port Status Owner DataDir LogFile
pick_cluster() {
	# Prefer the cluster on $PG_PORT, otherwise the first one listed.
	pg_lsclusters -h | awk -v p="$PG_PORT" '
		$3 == p { print; found = 1; exit }
		NR == 1 { first = $0 }
		END { if (!found && first != "") print first }'
}

cluster_line="$(pick_cluster)"
if [[ -z "$cluster_line" ]]; then
	ver="$(ls /usr/lib/postgresql | sort -V | tail -n1)"
	log "no cluster found; creating ${ver}/main on port ${PG_PORT}"
	as_root pg_createcluster --port "$PG_PORT" "$ver" main
	cluster_line="$(pick_cluster)"
	[[ -n "$cluster_line" ]] || die "pg_createcluster did not create a cluster"
fi

read -r PG_VER PG_CLUSTER port status _ <<<"$cluster_line"
[[ "$port" == "$PG_PORT" ]] ||
	log "WARNING: cluster ${PG_VER}/${PG_CLUSTER} listens on port ${port}, not ${PG_PORT}"
PG_PORT="$port"

cluster_status() {
	pg_lsclusters -h | awk -v v="$PG_VER" -v c="$PG_CLUSTER" '$1 == v && $2 == c { print $4 }'
}

wait_ready() {
	local i
	for ((i = 0; i < WAIT_SECONDS; i++)); do
		if pg_isready -q -h 127.0.0.1 -p "$PG_PORT" && as_postgres pg_isready -q -p "$PG_PORT"; then
			return 0
		fi
		sleep 1
	done
	die "cluster ${PG_VER}/${PG_CLUSTER} not accepting connections after ${WAIT_SECONDS}s (see /var/log/postgresql/postgresql-${PG_VER}-${PG_CLUSTER}.log)"
}

# --- 3. start -----------------------------------------------------------------
if [[ "$status" == online* ]]; then
	log "cluster ${PG_VER}/${PG_CLUSTER} is online (port ${PG_PORT})"
else
	log "starting cluster ${PG_VER}/${PG_CLUSTER} (was: ${status})"
	as_root pg_ctlcluster "$PG_VER" "$PG_CLUSTER" start
fi
wait_ready
log "accepting connections"

psql_admin() {
	as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres -tA "$@"
}

# --- 4. role ------------------------------------------------------------------
if [[ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '${PG_ROLE}'")" == 1 ]]; then
	log "role ${PG_ROLE} exists"
else
	log "creating role ${PG_ROLE}"
	psql_admin -c "CREATE ROLE ${PG_ROLE} LOGIN CREATEDB PASSWORD '${PG_PASSWORD}'"
fi
# Always (re)assert attributes and password; cheap and keeps things idempotent.
psql_admin -c "ALTER ROLE ${PG_ROLE} WITH LOGIN CREATEDB PASSWORD '${PG_PASSWORD}'"

# The read-only role the coordinator reads region databases with (audits, demand, stock):
# it may only SELECT, granted by each region database's migration (region.Migrate).
READER_ROLE=${QUOTA_PG_READER:-quota_reader}
READER_PASSWORD=${QUOTA_PG_READER_PASSWORD:-quota_reader}
if [[ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '${READER_ROLE}'")" != 1 ]]; then
	log "creating read-only role ${READER_ROLE}"
	psql_admin -c "CREATE ROLE ${READER_ROLE} LOGIN PASSWORD '${READER_PASSWORD}'"
fi
psql_admin -c "ALTER ROLE ${READER_ROLE} WITH LOGIN NOCREATEDB NOCREATEROLE NOSUPERUSER PASSWORD '${READER_PASSWORD}'"

# --- 5. max_connections --------------------------------------------------------
cur_max="$(psql_admin -c 'SHOW max_connections')"
if ((cur_max < MIN_MAX_CONNECTIONS)); then
	log "raising max_connections ${cur_max} -> ${MIN_MAX_CONNECTIONS} (restarting cluster)"
	psql_admin -c "ALTER SYSTEM SET max_connections = ${MIN_MAX_CONNECTIONS}"
	as_root pg_ctlcluster "$PG_VER" "$PG_CLUSTER" restart
	wait_ready
	cur_max="$(psql_admin -c 'SHOW max_connections')"
	((cur_max >= MIN_MAX_CONNECTIONS)) || die "max_connections is still ${cur_max} after restart"
fi
log "max_connections = ${cur_max}"

# --- 6. TCP password auth -------------------------------------------------------
tcp_check() {
	PGPASSWORD="$PG_PASSWORD" PGCONNECT_TIMEOUT=5 psql -X -q -w -h 127.0.0.1 -p "$PG_PORT" \
		-U "$PG_ROLE" -d postgres -tA -c 'SELECT 1' 2>&1
}

if out="$(tcp_check)" && [[ "$out" == 1 ]]; then
	:
else
	log "TCP password login failed (${out//$'\n'/ }); adding pg_hba rule"
	hba_file="$(psql_admin -c 'SHOW hba_file')"
	rule="host    all             ${PG_ROLE}           127.0.0.1/32            scram-sha-256"
	if ! grep -qF "$rule" "$hba_file"; then
		# pg_hba is first-match: put our rule before everything else.
		tmp="$(mktemp)"
		{ printf '# added by quota scripts/pg-setup.sh\n%s\n' "$rule"; cat "$hba_file"; } >"$tmp"
		cat "$tmp" >"$hba_file" # keep owner/permissions of the original
		rm -f "$tmp"
	fi
	# listen_addresses must include 127.0.0.1 (Debian default is 'localhost').
	psql_admin -c 'SELECT pg_reload_conf()' >/dev/null
	sleep 1
	out="$(tcp_check)" && [[ "$out" == 1 ]] ||
		die "cannot log in as ${PG_ROLE} via 127.0.0.1:${PG_PORT}: ${out}"
fi
log "ok: postgres://${PG_ROLE}:${PG_PASSWORD}@127.0.0.1:${PG_PORT}/postgres"
