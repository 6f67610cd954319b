# deploy/local/cluster-wan.sh: the regions of `deploy/local/cluster up --wan`, an ocean apart,
# sourced by deploy/local/cluster. Every process is placed in a region: region-R and
# region-R-2 (and region R's database) in R; etcd1 in us, etcd2 in eu, etcd3 in ap; both
# coordinators (and the ledger) in us. A connection between processes of different regions
# passes through a delay link of one process, wanproxy (quotad wanproxy), that adds the pair's
# one-way delay with jitter each way; connections inside a region stay direct.
#
#   - etcd clients (every region process and coordinator): the member of its own region
#     directly, listed first, the two others through R>S links (base+410..418).
#   - etcd peers: a member's advertised peer URL (base+191..193, in --initial-cluster, the same
#     for every member) is a link in front of it, to where it listens (base+401..403). One link
#     per member cannot know which member dials it, so the pair's round trip is split between
#     the two ends: member R's link adds a_R each way, with a_R + a_S = twice the R-S delay
#     (defaults us 10 ms, eu 70 ms, ap 150 ms). Raft sends a member's messages on the stream
#     the other member dialed into the sender's link, so a message from R takes a_R and its
#     answer from S takes a_S: a round trip between two members takes the pair's round trip, as
#     across the ocean; one way takes a_R or a_S, not the pair's delay.
#   - the coordinators (us) reach eu's and ap's region processes through us>R links
#     (base+422, 423, 432, 433), the addresses those processes advertise in etcd, and their
#     databases (read-only, for the audit) through us>R links to PostgreSQL (base+441..443).
#   - buyers reach a region's HTTP edge directly: a storefront is in its region.
#
# QUOTA_CLUSTER_WAN_DELAYS sets the one-way delays in milliseconds (default
# us-eu=40,us-ap=80,eu-ap=110; `up --wan=LIST` too), QUOTA_CLUSTER_WAN_JITTER the jitter
# (default 3). They are saved in cluster.env with the cluster.

WAN=0 WAN_ARG="" WAN_DELAYS="" WAN_JITTER=""
WAN_DEFAULT_DELAYS=us-eu=40,us-ap=80,eu-ap=110

# wan_setup: the settings of a --wan cluster, once load_config has read cluster.env (saved:
# the delays it was made with) or up's --wan (asked). wanproxy joins ALL and starts first.
wan_setup() {
	local saved=$1
	if [[ -n $WAN_ARG && -f $DIR/cluster.env && -z $saved ]]; then
		die "$DIR belongs to a cluster made without --wan: 'down --purge' first, or use another QUOTA_CLUSTER_DIR"
	fi
	if [[ -n $saved ]]; then
		WAN_DELAYS=$saved
	elif [[ -n $WAN_ARG ]]; then
		WAN_DELAYS=$WAN_ARG
		[[ $WAN_ARG == default ]] && WAN_DELAYS=${QUOTA_CLUSTER_WAN_DELAYS:-$WAN_DEFAULT_DELAYS}
	fi
	[[ -n $WAN_DELAYS ]] || return 0
	WAN=1
	[[ $DB_HA == 0 ]] || die "up --wan: not with --db-ha (a Patroni node would need its own region's links)"
	WAN_JITTER=${WAN_JITTER:-${QUOTA_CLUSTER_WAN_JITTER:-3}}
	[[ $WAN_JITTER =~ ^[0-9]+$ ]] && ((WAN_JITTER <= 1000)) || die "QUOTA_CLUSTER_WAN_JITTER=$WAN_JITTER: want milliseconds from 0 to 1000"
	wan_parse "$WAN_DELAYS"
	ALL=(wanproxy "${ALL[@]}")
	UP=(wanproxy "${UP[@]}")
}

# wan_parse LIST: WAN_MS[a-b] (both orders) from us-eu=40,us-ap=80,eu-ap=110; dies on a pair
# missing, unknown or out of range, or delays no split between etcd's members can give.
declare -A WAN_MS=()
wan_parse() {
	local kv pair ms a b
	local -a items
	IFS=, read -ra items <<<"$1"
	for kv in "${items[@]}"; do
		pair=${kv%%=*} ms=${kv#*=}
		ms=${ms%ms}
		a=${pair%-*} b=${pair#*-}
		[[ $kv == *=* && " ${REGIONS[*]} " == *" $a "* && " ${REGIONS[*]} " == *" $b "* && $a != "$b" ]] ||
			die "--wan=$1: '$kv': want pairs of regions (${REGIONS[*]}) as a-b=MILLISECONDS, e.g. $WAN_DEFAULT_DELAYS"
		[[ $ms =~ ^[0-9]+$ ]] && ((ms <= 5000)) || die "--wan=$1: '$kv': want whole milliseconds from 0 to 5000"
		WAN_MS[$a-$b]=$ms WAN_MS[$b-$a]=$ms
	done
	for a in "${REGIONS[@]}"; do
		for b in "${REGIONS[@]}"; do
			[[ $a == "$b" || -n ${WAN_MS[$a-$b]:-} ]] || die "--wan=$1: no delay for $a-$b: name all three pairs, e.g. $WAN_DEFAULT_DELAYS"
		done
		(($(wan_peer_ms "$a") >= 0)) || die "--wan=$1: $a's delays to the others are longer than theirs to each other: no split between etcd's members' links gives them"
	done
}

# wan_peer_ms R: the delay of the link in front of R's etcd member, a_R: R's two delays less
# the third, so that a_R + a_S is twice the R-S delay (the pair's round trip).
wan_peer_ms() {
	local o=() r
	for r in "${REGIONS[@]}"; do [[ $r == "$1" ]] || o+=("$r"); done
	echo $((WAN_MS[$1-${o[0]}] + WAN_MS[$1-${o[1]}] - WAN_MS[${o[0]}-${o[1]}]))
}

# place NAME: the region a process is in.
place() {
	case $1 in
	etcd1 | coordinator*) echo us ;;
	etcd2) echo eu ;;
	etcd3) echo ap ;;
	region-*) region_of "$1" ;;
	esac
}

region_index() { case $1 in us) echo 0 ;; eu) echo 1 ;; ap) echo 2 ;; esac }
# The links' ports: an etcd member's own peer port (behind its link), the R>S etcd client
# links, the us>R links to the region processes and to the regions' databases.
wan_peer_listen_port() { echo $((BASE + 400 + ${1#etcd})); }
# wan_peer_listen_port_of etcdN: the port member N listens for peers on (behind its link with --wan).
wan_peer_listen_port_of() { if [[ $WAN == 1 ]]; then wan_peer_listen_port "$1"; else peer_port "$1"; fi; }
wan_etcd_port() { echo $((BASE + 410 + 3 * $(region_index "$1") + ${2#etcd} - 1)); }
wan_region_port() { echo $((BASE + 420 + $(port "$1") - BASE)); }
wan_pg_port() { echo $((BASE + 441 + $(region_index "$1"))); }

# adv_addr NAME: the address a region process publishes in etcd (what the coordinators dial):
# with --wan, the us>R link to it for a region other than us.
adv_addr() {
	if [[ $WAN == 1 && $1 == region-* && $(place "$1") != us ]]; then
		echo "$HOST:$(wan_region_port "$1")"
	else
		addr "$1"
	fi
}

# wan_etcd_endpoints NAME: the etcd endpoints of process NAME: its region's member first and
# directly (a region writes its buyer bindings through the first), the others through its
# region's links.
wan_etcd_endpoints() {
	local from n out=()
	from=$(place "$1")
	for n in "${ETCDS[@]}"; do
		if [[ $(place "$n") == "$from" ]]; then out=("$(addr "$n")" "${out[@]}"); else out+=("https://$HOST:$(wan_etcd_port "$from" "$n")"); fi
	done
	(
		IFS=,
		echo "${out[*]}"
	)
}

# wan_pg_hostport: PostgreSQL's host:port, from PG_URL.
wan_pg_hostport() {
	local rest=${PG_URL#*://}
	rest=${rest#*@}
	rest=${rest%%/*}
	[[ $rest == *:* ]] || rest+=:5432
	echo "$rest"
}

# wan_routes: sets ROUTES to wanproxy's --route flags.
wan_routes() {
	ROUTES=()
	local n r s d j=${WAN_JITTER}ms
	for n in "${ETCDS[@]}"; do
		d=$(wan_peer_ms "$(place "$n")")
		ROUTES+=(--route "$n/peers=$HOST:$(peer_port "$n")=$HOST:$(wan_peer_listen_port "$n")=${d}ms=$j")
		for r in "${REGIONS[@]}"; do
			s=$(place "$n")
			[[ $r == "$s" ]] && continue
			ROUTES+=(--route "$r>$s/$n=$HOST:$(wan_etcd_port "$r" "$n")=$HOST:$(port "$n")=${WAN_MS[$r-$s]}ms=$j")
		done
	done
	for n in "${PRIMARIES[@]}" "${STANDBY_NAMES[@]}"; do
		s=$(place "$n")
		[[ $s == us ]] && continue
		ROUTES+=(--route "us>$s/$n=$(adv_addr "$n")=$(addr "$n")=${WAN_MS[us-$s]}ms=$j")
	done
	for s in "${REGIONS[@]}"; do
		[[ $s == us ]] && continue
		ROUTES+=(--route "us>$s/db=$HOST:$(wan_pg_port "$s")=$(wan_pg_hostport)=${WAN_MS[us-$s]}ms=$j")
	done
}

# wan_ports: every port wanproxy listens on.
wan_ports() {
	local i out=()
	wan_routes
	for ((i = 1; i < ${#ROUTES[@]}; i += 2)); do
		local spec=${ROUTES[i]#*=}
		out+=("${spec%%=*}")
	done
	printf '%s\n' "${out[@]##*:}"
}

# wan_reader_url R: the URL the coordinators read region R's database at: through the us>R
# link for a region other than us.
wan_reader_url() {
	local url
	url=$(reader_url "$(db_name "$1")")
	if [[ $WAN == 1 && $1 != us ]]; then with_addr "$url" "$HOST:$(wan_pg_port "$1")"; else echo "$url"; fi
}

# wan_say: up's line on the links.
wan_say() {
	[[ $WAN == 1 ]] || return 0
	local r
	say "wan: one-way delays ${WAN_DELAYS} ms, jitter ${WAN_JITTER} ms; etcd members' peer links $(for r in "${REGIONS[@]}"; do printf '%s %sms ' "$r" "$(wan_peer_ms "$r")"; done)"
}

# up_wan_arg ARGS...: takes --wan or --wan=DELAYS out of up's arguments (WAN_ARG: "default" or
# the delays), the others left in UP_ARGS.
up_wan_arg() {
	UP_ARGS=()
	local a
	for a in "$@"; do
		case $a in
		--wan) WAN_ARG=default ;;
		--wan=*)
			WAN_ARG=${a#--wan=}
			[[ -n $WAN_ARG ]] || die "up: --wan=: name the one-way delays, e.g. $WAN_DEFAULT_DELAYS"
			;;
		*) UP_ARGS+=("$a") ;;
		esac
	done
}
