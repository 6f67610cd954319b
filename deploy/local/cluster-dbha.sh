# deploy/local/cluster-dbha.sh: the database failover of `deploy/local/cluster up --db-ha`,
# sourced by deploy/local/cluster. Each chosen region's database and the ledger run as a
# Patroni cluster of two PostgreSQL 15 nodes (db-us-1, db-us-2, ..., db-ledger-1, db-ledger-2),
# a primary and a synchronous standby, with Patroni's state in the cluster's own etcd under
# /quota-patroni/ as etcd user quota/patroni (role quota-patroni: that prefix only). The
# databases not chosen stay on PG_URL's server, as without --db-ha.
# See deploy/local/README.md ("Database failover") and docs/decisions/0008-patroni.md.

# DB_CHOICES: what up --db-ha may make HA; DB_CLUSTERS: what this cluster made HA (saved in
# cluster.env as DB_HA=us,ledger), DB_NODES their nodes, the first of each cluster first.
DB_CHOICES=(us eu ap ledger)
DB_CLUSTERS=() DB_NODES=()
# Patroni: the leader key's ttl (s); loop_wait 1 s; retry_timeout so that
# loop_wait + 2*retry_timeout <= ttl, as Patroni wants.
DB_TTL=${QUOTA_CLUSTER_DB_TTL:-10}
DB_NAMESPACE=/quota-patroni/
DB_ETCD_USER=quota/patroni
DB_ETCD_ROLE=quota-patroni
PG_BIN=/usr/lib/postgresql/15/bin

# db_choose LIST: the clusters of a comma-separated LIST (us, eu, ap, ledger; "all": every
# one) in DB_CHOICES's order, comma-separated; dies naming what it refuses.
db_choose() {
	local list=$1 want c out=() seen=","
	[[ $list == all ]] && list=$(IFS=,; echo "${DB_CHOICES[*]}")
	[[ -n $list ]] || die "--db-ha=: name what to run on Patroni, a comma-separated list of ${DB_CHOICES[*]} (or all)"
	local -a asked
	IFS=, read -ra asked <<<"$list"
	for want in "${asked[@]}"; do
		[[ " ${DB_CHOICES[*]} " == *" $want "* ]] || die "--db-ha=$1: unknown database '$want': want a comma-separated list of ${DB_CHOICES[*]} (or all)"
		[[ $seen != *",$want,"* ]] || die "--db-ha=$1: '$want' named twice"
		seen+="$want,"
	done
	for c in "${DB_CHOICES[@]}"; do [[ $seen == *",$c,"* ]] && out+=("$c"); done
	(IFS=,; echo "${out[*]}")
}

# db_setup: the settings of a --db-ha cluster, once load_config has set DB_HA_LIST: its nodes
# join ALL and UP, its files live in DB_DIR (owned by postgres, who runs Patroni).
db_setup() {
	[[ -n $DB_HA_LIST ]] || return 0
	DB_HA=1
	IFS=, read -ra DB_CLUSTERS <<<"$DB_HA_LIST"
	local c
	DB_NODES=()
	for c in "${DB_CLUSTERS[@]}"; do DB_NODES+=("db-$c-1"); done
	for c in "${DB_CLUSTERS[@]}"; do DB_NODES+=("db-$c-2"); done
	[[ $DB_TTL =~ ^[0-9]+$ ]] && ((DB_TTL >= 4 && DB_TTL <= 60)) ||
		die "QUOTA_CLUSTER_DB_TTL=$DB_TTL: want whole seconds from 4 to 60"
	ALL+=("${DB_NODES[@]}")
	UP+=("${DB_NODES[@]}")
	DB_SECRETS=$DIR/db-ha.secrets
	DB_ADMIN_PGPASS=$DIR/db-admin.pgpass
}

db_node() { [[ $1 == db-* ]]; }
# db_cluster NAME: the cluster of a node (db-us-1: us; db-ledger-2: ledger).
db_cluster() {
	local c=${1#db-}
	echo "${c%-[12]}"
}
db_slot() {
	case $1 in us) echo 1 ;; eu) echo 2 ;; ap) echo 3 ;; ledger) echo 4 ;; esac
}
# db_pg_port NAME: PostgreSQL's port: db-us-1 base+201, db-eu-1 +202, db-ap-1 +203,
# db-ledger-1 +204, and the second nodes 10 above. Patroni's REST API listens 100 above.
db_pg_port() { echo $((BASE + 200 + $(db_slot "$(db_cluster "$1")") + 10 * (${1##*-} - 1))); }
db_rest_port() { echo $(($(db_pg_port "$1") + 100)); }
db_hosts() { # db_hosts CLUSTER: host:port of both nodes, comma-separated (a multi-host URL's)
	echo "$HOST:$(db_pg_port "db-$1-1"),$HOST:$(db_pg_port "db-$1-2")"
}
# db_of_database DB: the cluster that holds database DB.
db_of_database() {
	if [[ $1 == "${PREFIX}_coordinator" ]]; then echo ledger; else echo "${1#"${PREFIX}"_region_}"; fi
}
# db_on_patroni DB: database DB lives on a Patroni cluster (not on PG_URL's server).
db_on_patroni() {
	local c
	c=$(db_of_database "$1")
	[[ " ${DB_CLUSTERS[*]} " == *" $c "* ]]
}

# db_ha_url DB QUERY: the multi-host URL of database DB (PG_URL's user, no password) on the
# nodes of its cluster; target_session_attrs=read-write so that a client connects to the
# primary, whichever node that is now.
db_ha_url() {
	local rest=${PG_URL#*://} user="" q=$2
	[[ $rest == *@* ]] && user=${rest%%@*} && user=${user%%:*}@
	q=${q:+$q&}
	q=${q#\?}
	echo "postgres://$user$(db_hosts "$(db_of_database "$1")")/$1?${q}target_session_attrs=read-write"
}

# db_secret KEY: a generated password (superuser, replication, rest, etcd), made once and kept
# in DB_SECRETS (0600).
db_secret() {
	local v
	if [[ -f $DB_SECRETS ]]; then
		v=$(awk -F= -v k="$1" '$1 == k {print $2}' "$DB_SECRETS")
		[[ -n $v ]] && {
			echo "$v"
			return 0
		}
	fi
	v=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	(umask 077 && printf '%s=%s\n' "$1" "$v" >>"$DB_SECRETS")
	echo "$v"
}

# db_config NAME: node NAME's Patroni configuration (YAML), on stdout.
db_config() {
	local name=$1 c pg rest
	c=$(db_cluster "$name") pg=$(db_pg_port "$name") rest=$(db_rest_port "$name")
	cat <<EOF
scope: $c
namespace: $DB_NAMESPACE
name: $name
log:
  level: WARNING
restapi:
  listen: $HOST:$rest
  connect_address: $HOST:$rest
  authentication: {username: patroni, password: $(db_secret rest)}
etcd3:
  hosts: $(etcd_hostports)
  protocol: https
  cacert: $DB_DIR/etcd/ca.crt
  cert: $DB_DIR/etcd/etcd.patroni.crt
  key: $DB_DIR/etcd/etcd.patroni.key
  username: $DB_ETCD_USER
  password: $(db_secret etcd)
bootstrap:
  dcs:
    ttl: $DB_TTL
    loop_wait: 1
    retry_timeout: $(((DB_TTL - 1) / 2))
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      parameters:
        max_connections: 200
        shared_buffers: 32MB
        wal_log_hints: 'on'
        wal_keep_size: 64MB
        synchronous_commit: 'on'
        wal_retrieve_retry_interval: 500ms
  initdb: [{encoding: UTF8}, data-checksums]
postgresql:
  listen: $HOST:$pg
  connect_address: $HOST:$pg
  data_dir: $DB_DIR/$name
  bin_dir: $PG_BIN
  pgpass: $DB_DIR/$name.pgpass
  basebackup: {checkpoint: fast}
  authentication:
    superuser: {username: postgres, password: $(db_secret superuser)}
    replication: {username: replicator, password: $(db_secret replication)}
  parameters:
    unix_socket_directories: '$DB_DIR'
  pg_hba:
    - local all postgres peer
    - host replication replicator 127.0.0.1/32 scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
EOF
}

etcd_hostports() {
	local n out=()
	for n in "${ETCDS[@]}"; do out+=("$HOST:$(port "$n")"); done
	(
		IFS=,
		echo "${out[*]}"
	)
}

# db_command NAME: Patroni as postgres, with a clean environment (PGPASSWORD or PGPASSFILE
# would override its own passfile and break pg_rewind). start_one runs it under setsid.
db_command() {
	CMD=(setpriv --reuid postgres --regid postgres --init-groups
		env -i PATH="$PG_BIN:/usr/bin:/bin" LANG=C.UTF-8 HOME="$DB_DIR" patroni "$DB_DIR/$1.yml")
}

# db_prepare: Patroni installed, DB_DIR owned by postgres with each node's configuration, the
# etcd certificate Patroni presents (no CN: etcd's gateway refuses a request whose certificate
# names a user) and its etcd user.
db_prepare() {
	"$ROOT/scripts/patroni-setup.sh" >/dev/null
	mkdir -p "$DB_DIR/etcd"
	setpriv --reuid postgres --regid postgres --init-groups test -x "$DB_DIR" 2>/dev/null || chown postgres: "$DB_DIR"
	setpriv --reuid postgres --regid postgres --init-groups test -x "$DB_DIR" ||
		die "the postgres user cannot reach $DB_DIR (a parent directory closed to others?): set QUOTA_CLUSTER_DB_DIR"
	db_etcd_cert
	cp "$CERTS/ca.crt" "$CERTS/etcd.patroni.crt" "$CERTS/etcd.patroni.key" "$DB_DIR/etcd/"
	local n
	for n in "${DB_NODES[@]}"; do
		(umask 077 && db_config "$n" >"$DB_DIR/$n.yml")
	done
	chown -R postgres: "$DB_DIR"
	chmod 700 "$DB_DIR/etcd"
	(umask 077 && printf '*:*:*:postgres:%s\n' "$(db_secret superuser)" >"$DB_ADMIN_PGPASS")
}

# db_etcd_cert: certs/etcd.patroni.crt (and .key), a client certificate of the cluster's CA
# with no common name, made with openssl when missing.
db_etcd_cert() {
	[[ -f $CERTS/etcd.patroni.crt ]] && return 0
	local tmp
	tmp=$(mktemp -d)
	(umask 077 && openssl ecparam -name prime256v1 -genkey -noout -out "$CERTS/etcd.patroni.key") 2>/dev/null
	openssl req -new -key "$CERTS/etcd.patroni.key" -subj "/O=quota/OU=patroni" -out "$tmp/csr" 2>/dev/null
	printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' >"$tmp/ext"
	openssl x509 -req -in "$tmp/csr" -CA "$CERTS/ca.crt" -CAkey "$CERTS/ca.key" -CAcreateserial -CAserial "$tmp/srl" \
		-days 365 -sha256 -extfile "$tmp/ext" -out "$CERTS/etcd.patroni.crt" 2>/dev/null
	rm -rf "$tmp"
	say "certificates: created etcd.patroni.crt (Patroni's, no common name)"
}

# db_etcd_user: etcd user quota/patroni (password), role quota-patroni (read+write under
# /quota-patroni/ and nothing else), made as etcd's root when missing.
db_etcd_user() {
	local ep
	ep=$(addr etcd1)
	for ep in $(etcd_endpoints | tr , ' '); do
		etcd_ctl "$ep" user get "$DB_ETCD_USER" >/dev/null 2>&1 && return 0
		if etcd_ctl "$ep" role add "$DB_ETCD_ROLE" >/dev/null 2>&1 || etcd_ctl "$ep" role get "$DB_ETCD_ROLE" >/dev/null 2>&1; then
			etcd_ctl "$ep" role grant-permission --prefix=true "$DB_ETCD_ROLE" readwrite "$DB_NAMESPACE" >/dev/null &&
				etcd_ctl "$ep" user add "$DB_ETCD_USER" --new-user-password="$(db_secret etcd)" >/dev/null &&
				etcd_ctl "$ep" user grant-role "$DB_ETCD_USER" "$DB_ETCD_ROLE" >/dev/null &&
				{
					say "etcd: user $DB_ETCD_USER, role $DB_ETCD_ROLE (read+write $DB_NAMESPACE)"
					return 0
				}
		fi
	done
	die "could not make etcd user $DB_ETCD_USER"
}

# db_rest NAME PATH [CURL ARGS]: GET Patroni's REST API of node NAME; prints the body, returns
# 0 on HTTP 200.
db_rest() {
	local name=$1 path=$2
	shift 2
	curl -fsS -m 2 "$@" "http://$HOST:$(db_rest_port "$name")$path" 2>/dev/null
}

db_ready() { db_rest "$1" /health >/dev/null; }

# db_primary CLUSTER: the node that is primary now (Patroni's /primary: 200 only at the
# node that runs as primary and holds the leader key); returns 1 when none is.
db_primary() {
	local n
	for n in "db-$1-1" "db-$1-2"; do
		if db_rest "$n" /primary >/dev/null; then
			echo "$n"
			return 0
		fi
	done
	return 1
}

# db_writable CLUSTER: its primary accepts a write (Patroni's /primary answers before).
db_writable() {
	PGPASSFILE=$DB_ADMIN_PGPASS PGCONNECT_TIMEOUT=2 psql -X -qtA -v ON_ERROR_STOP=1 \
		"postgres://postgres@$(db_hosts "$1")/postgres?target_session_attrs=read-write" \
		-c 'CREATE TEMP TABLE w (x int)' >/dev/null 2>&1
}

# db_sync CLUSTER: the cluster has a synchronous standby (Patroni's /sync at either node).
db_sync() { db_rest "db-$1-1" /sync >/dev/null || db_rest "db-$1-2" /sync >/dev/null; }

# db_psql CLUSTER SQL: as the superuser, at the cluster's primary.
db_psql() {
	PGPASSFILE=$DB_ADMIN_PGPASS psql -X -qtA -v ON_ERROR_STOP=1 \
		"postgres://postgres@$(db_hosts "$1")/postgres?target_session_attrs=read-write" -c "$2"
}

# db_ensure_dbs: on each cluster's primary, the roles of PG_URL (its user, with its password,
# and the read-only quota_reader) and the database(s) the cluster holds.
db_ensure_dbs() {
	local rest=${PG_URL#*://} user pass="" c db
	user=${rest%%@*}
	[[ $user == *:* ]] && pass=${user#*:}
	user=${user%%:*}
	for c in "${DB_CLUSTERS[@]}"; do
		if [[ $(db_psql "$c" "SELECT 1 FROM pg_roles WHERE rolname = '$user'") != 1 ]]; then
			db_psql "$c" "CREATE ROLE $user LOGIN CREATEDB PASSWORD '$pass'" >/dev/null
		fi
		if [[ $(db_psql "$c" "SELECT 1 FROM pg_roles WHERE rolname = '$READER'") != 1 ]]; then
			db_psql "$c" "CREATE ROLE $READER LOGIN PASSWORD '$READER_PASSWORD'" >/dev/null
		fi
		if [[ $c == ledger ]]; then db=$(db_name coordinator); else db=$(db_name "$c"); fi
		if [[ $(db_psql "$c" "SELECT 1 FROM pg_database WHERE datname = '$db'") != 1 ]]; then
			db_psql "$c" "CREATE DATABASE $db OWNER $user" >/dev/null
			say "created database $db on cluster $c"
		fi
	done
}

# db_up: (in up, once etcd has a quorum) each cluster's first node, a writable primary; then
# the second nodes, which copy the primary (pg_basebackup with a fast checkpoint) while up makes
# the roles and databases and starts the regions and coordinators; db_wait_sync waits until
# each is the synchronous standby.
db_up() {
	db_etcd_user
	local n c k=${#DB_CLUSTERS[@]}
	for n in "${DB_NODES[@]:0:k}"; do start_one "$n"; done
	WATCH=("${ETCDS[@]}" "${DB_NODES[@]:0:k}")
	for c in "${DB_CLUSTERS[@]}"; do
		wait_until "database cluster $c: a primary that accepts writes" db_writable "$c"
	done
	for n in "${DB_NODES[@]:k}"; do start_one "$n"; done
	db_ensure_dbs
}

# db_wait_sync: (at the end of up) every cluster has its synchronous standby: from then on an
# acknowledged commit is on two servers.
db_wait_sync() {
	local c
	for c in "${DB_CLUSTERS[@]}"; do
		wait_until "database cluster $c: a synchronous standby" db_sync "$c"
	done
}

# db_postmaster NAME: the pid of node NAME's postmaster, if it runs.
db_postmaster() {
	local f=$DB_DIR/$1/postmaster.pid pid
	[[ -f $f ]] || return 1
	pid=$(head -1 "$f")
	[[ $pid =~ ^[0-9]+$ && -d /proc/$pid ]] || return 1
	echo "$pid"
}

# db_down: the nodes, the standbys first (so that no primary fails over on the way down).
db_down() {
	local c p n standbys=() primaries=()
	for c in "${DB_CLUSTERS[@]}"; do
		p=$(db_primary "$c") || p=""
		for n in "db-$c-1" "db-$c-2"; do
			if [[ $n == "$p" ]]; then primaries+=("$n"); else standbys+=("$n"); fi
		done
	done
	signal_wait TERM "${standbys[@]}"
	signal_wait TERM "${primaries[@]}"
}

# db_status_role NAME: node NAME's role, as Patroni's REST API reports it.
db_status_role() {
	local js role st
	js=$(db_rest "$1" /patroni) || {
		echo "rest :$(db_rest_port "$1"), not answering"
		return 0
	}
	role=$(jq -r '.role // "?"' <<<"$js")
	st=$(jq -r '.state // "?"' <<<"$js")
	[[ $role == master ]] && role=primary
	if [[ $role == replica ]] && db_rest "$1" /sync >/dev/null; then role="synchronous standby"; fi
	echo "rest :$(db_rest_port "$1"), $role ($st)"
}

# cmd_db_primary CLUSTER: print the node that is primary now.
cmd_db_primary() {
	[[ $DB_HA == 1 ]] || die "db-primary: this cluster runs its databases on one server (up --db-ha runs them on Patroni)"
	local c=${1:-}
	[[ " ${DB_CHOICES[*]} " == *" $c "* ]] || die "db-primary: name a region or the ledger: ${DB_CHOICES[*]}"
	[[ " ${DB_CLUSTERS[*]} " == *" $c "* ]] || die "db-primary: $c's database is on one server, not on Patroni (this cluster's: ${DB_CLUSTERS[*]})"
	db_primary "$c" || die "db-primary: no node of $c is primary now"
}
