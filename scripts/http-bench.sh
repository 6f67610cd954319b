#!/usr/bin/env bash
# The storefront HTTP edge's benchmark behind `make http-bench` (docs/http-benchmarks.md).
# One run, one server, one load shape: wrk with the same threads, connections and duration
# against every HTTP variant, and the gRPC reserves from Go in the
# same run, then one table with the ratios against the targets:
#
#   (1) POST /v1/sales/{sale}/reservations on a sold-out SKU (409 SOLD_OUT)  >= 0.70 x ping
#   (2) GET /v1/sales/{sale}/admissions/{id}, the admission poll              >= 0.70 x ping
#   (3) a durable reserve over HTTP                                         >= 0.60 x over gRPC
#
# with GET /v1/ping (a no-op handler on the same server) as the HTTP ceiling.
#
#  - installs wrk when missing (apt), builds bin/ and the Go helper scripts/httpbench
#  - starts `quotad dev --insecure` (one region, us): PLAINTEXT, no client certificates. wrk
#    speaks TLS but cannot present a client certificate, which every TLS route needs; so
#    these figures leave out TLS on both the HTTP and the gRPC side.
#  - in a scratch directory, on ports BASE..BASE+1 (gRPC), BASE+1001 (HTTP), BASE+90..91
#    (etcd), BASE 37400 by default, with databases <prefix>_coordinator and
#    <prefix>_region_us (prefix qhb_<pid>_<random>), all dropped at the end
#  - before the clock: admits the buyers each variant needs over gRPC (tickets, or admission
#    ids) and sells the sold-out SKU out; then waits for a quiet machine before each variant
#
# Settings (environment): HTTP_BENCH_DURATION (seconds, default 10), HTTP_BENCH_THREADS (2),
# HTTP_BENCH_CONNECTIONS (64, also the gRPC callers), HTTP_BENCH_TICKETS (tickets per
# reserve variant, default 195000: a waiting room holds 200,000 entries), HTTP_BENCH_BASE_PORT
# (37400), HTTP_BENCH_QUOTAD_FLAGS (more flags of quotad dev; default "--memory-limit 4GiB"),
# QUOTA_PG_URL (postgres://quota:quota@127.0.0.1:5432/postgres), HTTP_BENCH_PERF_DIR (unset: none;
# a directory: a CPU profile of quotad during each row, `perf record -F 499 -g` into
# DIR/<row>.perf.data, read with `perf report -i`; needs perf and the right to trace quotad).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="/usr/local/go/bin:$PATH"
PG_URL=${QUOTA_PG_URL:-postgres://quota:quota@127.0.0.1:5432/postgres}
DURATION=${HTTP_BENCH_DURATION:-10}
THREADS=${HTTP_BENCH_THREADS:-2}
CONNS=${HTTP_BENCH_CONNECTIONS:-64}
TICKETS=${HTTP_BENCH_TICKETS:-195000}
BASE=${HTTP_BENCH_BASE_PORT:-37400}
PERF_DIR=${HTTP_BENCH_PERF_DIR:-}
# The set-up leaves about 600,000 waiting-room entries live in the region (three sales of
# HTTP_BENCH_TICKETS each); at quotad's default Go memory limit (900MiB, with --gc-percent
# 400) that keeps its collector at the limit and every request up to 3 times dearer
# (docs/http-benchmarks.md). The default here lifts the limit; HTTP_BENCH_QUOTAD_FLAGS=" " runs
# quotad's defaults.
read -r -a QUOTAD_FLAGS <<<"${HTTP_BENCH_QUOTAD_FLAGS:---memory-limit 4GiB}"

say() { printf 'http-bench: %s\n' "$*" >&2; }
die() { printf 'http-bench: ERROR: %s\n' "$*" >&2; exit 1; }
as_root() { if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n -- "$@"; fi; }
int_in() { [[ $2 =~ ^[0-9]+$ ]] && (($2 >= $3 && $2 <= $4)) || die "$1=$2: want a whole number in $3..$4"; }

int_in HTTP_BENCH_DURATION "$DURATION" 1 60
int_in HTTP_BENCH_THREADS "$THREADS" 1 64
int_in HTTP_BENCH_CONNECTIONS "$CONNS" "$THREADS" 10000
int_in HTTP_BENCH_TICKETS "$TICKETS" 1000 199000
int_in HTTP_BENCH_BASE_PORT "$BASE" 1024 64000
if [[ -n $PERF_DIR ]]; then
	command -v perf >/dev/null 2>&1 || die "HTTP_BENCH_PERF_DIR is set but perf is not installed"
	mkdir -p "$PERF_DIR" || die "HTTP_BENCH_PERF_DIR=$PERF_DIR: cannot create it"
	PERF_DIR=$(cd "$PERF_DIR" && pwd)
fi

# --- 1. tools -------------------------------------------------------------------
if command -v wrk >/dev/null 2>&1; then
	say "wrk already installed"
else
	say "wrk not found; installing via apt"
	as_root apt-get update
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y wrk
	command -v wrk >/dev/null 2>&1 || die "apt did not install wrk"
fi
command -v psql >/dev/null 2>&1 || die "psql not found (make pg installs PostgreSQL)"
psql -X -q -w "$PG_URL" -tAc 'SELECT 1' >/dev/null 2>&1 || die "PostgreSQL not reachable at $PG_URL (run make pg)"

for port in "$BASE" $((BASE + 1)) $((BASE + 1001)) $((BASE + 90)) $((BASE + 91)); do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		die "port $port is in use; pick other ports with HTTP_BENCH_BASE_PORT"
	fi
done

WORK=$(mktemp -d /tmp/http-bench.XXXXXX)
PREFIX="qhb_$$_$RANDOM"
QUOTAD=""
cleanup() {
	local rc=$?
	if [[ -n $QUOTAD ]]; then
		kill "$QUOTAD" 2>/dev/null || true
		wait "$QUOTAD" 2>/dev/null || true
	fi
	for db in coordinator region_us; do
		psql -X -q -w "$PG_URL" -c "DROP DATABASE IF EXISTS ${PREFIX}_$db" >/dev/null 2>&1 ||
			say "could not drop ${PREFIX}_$db (drop it by hand)"
	done
	if ((rc != 0)) && [[ -f $WORK/quotad.log ]]; then
		say "failed; the last lines of quotad's log:"
		tail -n 20 "$WORK/quotad.log" >&2
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "building bin/ and the helper"
(cd "$ROOT" && go build -o bin/ ./cmd/... && go build -o "$WORK/httpbench" scripts/httpbench/main.go)
HB=$WORK/httpbench
QUOTACTL=("$ROOT/bin/quotactl" --insecure --coordinator "127.0.0.1:$BASE")
GRPC=127.0.0.1:$((BASE + 1))
HTTP=http://127.0.0.1:$((BASE + 1001))

# --- 2. the server ---------------------------------------------------------------
mkdir -p "$WORK/data"
say "starting quotad dev --insecure (PLAINTEXT: wrk cannot present client certificates), databases ${PREFIX}_*"
# wrk's CONNS connections all come from 127.0.0.1, with the scrapes of /metrics beside them:
# above quotad's bound of 64 open connections per address (docs/security.md, "Connection
# exhaustion"), which the run raises for itself.
PER_IP=$((CONNS + 64))
MAX_CONNS=$((PER_IP > 1024 ? PER_IP : 1024))
"$ROOT/bin/quotad" dev --insecure --regions us --base-port "$BASE" --db-prefix "$PREFIX" \
	--data-dir "$WORK/data" --pg-url "$PG_URL" --max-connections "$MAX_CONNS" --max-connections-per-ip "$PER_IP" \
	"${QUOTAD_FLAGS[@]}" >"$WORK/quotad.log" 2>&1 &
QUOTAD=$!
for _ in $(seq 1 120); do
	if grep -q 'storefront HTTP' "$WORK/quotad.log" && curl -fsS -o /dev/null "$HTTP/v1/ping" 2>/dev/null; then break; fi
	kill -0 "$QUOTAD" 2>/dev/null || die "quotad dev exited"
	sleep 0.5
done
curl -fsS -o /dev/null "$HTTP/v1/ping" || die "quotad dev's HTTP edge did not answer within 60 s"

# --- 3. sales and admissions (before any clock) ------------------------------------
S=hb$RANDOM
sale() { # id units admit-rate max-live (admit-rate 0: no waiting room)
	local room=()
	(($3 > 0)) && room=(--admit-rate "$3" --ticket-ttl 1h --max-live-tickets "$4") # 1h: the longest; set-up is slow on a busy machine
	"${QUOTACTL[@]}" sale create --sale "$1" --sku a="$2" --per-user-limit 1 --hold-ttl 1h "${room[@]}" --allocate us=1 >/dev/null
}
sale "$S-poll" 10 1 1               # admits one buyer, then no one: the rest stay queued
sale "$S-polla" 10 100000 100000    # admits everyone at once
sale "$S-soldout" 10 100000 100000
sale "$S-lg" 5000000 0 0            # no waiting room: loadgen reserves without tickets
sale "$S-grpc" 5000000 100000 1000000
sale "$S-grpc8" 5000000 100000 1000000
sale "$S-http" 5000000 100000 1000000
say "sales $S-{poll,polla,soldout,lg,grpc,grpc8,http} created"
enter() { "$HB" enter -grpc "$GRPC" -concurrency 256 "$@" | tee -a "$WORK/setup.txt" >&2; }
enter -sale "$S-grpc" -users "$TICKETS" -prefix g- -want tickets -out "$WORK/grpc.tickets"
enter -sale "$S-grpc8" -users "$TICKETS" -prefix g- -want tickets -out "$WORK/grpc8.tickets"
enter -sale "$S-http" -users "$TICKETS" -prefix h- -want tickets -out "$WORK/http.tickets"
enter -sale "$S-poll" -users 1000 -prefix q- -want queued -out "$WORK/poll.ids"
enter -sale "$S-polla" -users 1000 -prefix a- -want admitted -out "$WORK/polla.ids"
enter -sale "$S-soldout" -users 1010 -prefix s- -want tickets -out "$WORK/soldout.all"

# Sell the sold-out SKU: 10 reservations paid for, then wait for the coordinator's flag.
"$HB" reserve -grpc "$GRPC" -sale "$S-soldout" -sku a -tickets "$WORK/soldout.all" -max 10 -concurrency 10 -confirm >&2
tail -n +11 "$WORK/soldout.all" >"$WORK/soldout.tickets"
probe=$(head -n 1 "$WORK/soldout.tickets")
SOLDOUT_ANSWER=""
for _ in $(seq 1 60); do
	SOLDOUT_ANSWER=$(curl -sS -X POST "$HTTP/v1/sales/$S-soldout/reservations" \
		-d "{\"ticket\":\"$probe\",\"sku\":\"a\",\"quantity\":1,\"request_key\":\"probe\"}" || true)
	[[ $SOLDOUT_ANSWER == *SOLD_OUT* ]] && break
	sleep 0.5
done
say "sold-out SKU answers: $SOLDOUT_ANSWER"

# --- 4. the wrk script ----------------------------------------------------------------
cat >"$WORK/hb.lua" <<'LUA'
-- Arguments: mode (ping, poll, soldout, reserve), file (one ticket or admission id a line;
-- thread t of n takes lines t, t+n, ...; "-" for none), sale, sku, threads. Every mode builds
-- each request with wrk.format and reads each answer in response(), so wrk does the same
-- work per request in every variant.
local threads, made = {}, 0
function setup(thread)
	thread:set("tid", made)
	made = made + 1
	table.insert(threads, thread)
end

function init(args)
	mode, file, sale, sku = args[1], args[2], args[3], args[4]
	local n = tonumber(args[5])
	items, idx, sent, wrapped = {}, 0, 0, 0
	c200, c201, c202, c409, c4xx, c5xx, other, soldout, exhausted = 0, 0, 0, 0, 0, 0, 0, 0, 0
	if file ~= "-" then
		local i = 0
		for line in io.lines(file) do
			if i % n == tid then items[#items + 1] = line end
			i = i + 1
		end
	end
	hdr = { ["Content-Type"] = "application/json" }
end

function request()
	sent = sent + 1
	if mode == "ping" then
		return wrk.format("GET", "/v1/ping")
	elseif mode == "poll" then
		idx = idx % #items + 1
		return wrk.format("GET", "/v1/sales/" .. sale .. "/admissions/" .. items[idx])
	end
	-- soldout goes round its tickets (a refusal uses none); reserve uses each once, and past
	-- the end would go round again: replays (200), not counted as reservations.
	idx = idx + 1
	if idx > #items then idx, wrapped = 1, wrapped + 1 end
	local key = "wrk-" .. tid .. "-" .. idx
	if mode == "soldout" then key = "so-" .. tid .. "-" .. sent end
	return wrk.format("POST", "/v1/sales/" .. sale .. "/reservations", hdr,
		'{"ticket":"' .. items[idx] .. '","sku":"' .. sku .. '","quantity":1,"request_key":"' .. key .. '"}')
end

function response(status, headers, body)
	if status == 200 then c200 = c200 + 1
	elseif status == 201 then c201 = c201 + 1
	elseif status == 202 then c202 = c202 + 1
	elseif status == 409 then
		c409 = c409 + 1
		if string.find(body, '"SOLD_OUT"', 1, true) then soldout = soldout + 1
		elseif string.find(body, '"REGION_EXHAUSTED"', 1, true) then exhausted = exhausted + 1 end
	elseif status >= 500 then c5xx = c5xx + 1
	elseif status >= 400 then c4xx = c4xx + 1
	else other = other + 1 end
end

function done(summary, latency, requests)
	local t = { c200 = 0, c201 = 0, c202 = 0, c409 = 0, c4xx = 0, c5xx = 0, other = 0, soldout = 0, exhausted = 0, wrapped = 0 }
	for _, th in ipairs(threads) do
		for k, _ in pairs(t) do t[k] = t[k] + th:get(k) end
	end
	local e = summary.errors
	io.write(string.format("HB cmd=wrk mode=%s requests=%d seconds=%.3f req_per_sec=%.0f s200=%d s201=%d s202=%d s409=%d " ..
		"sold_out=%d region_exhausted=%d s4xx=%d s5xx=%d other=%d socket_errors=%d wrapped=%d p50_ms=%.2f p99_ms=%.2f\n",
		threads[1]:get("mode"), summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
		t.c200, t.c201, t.c202, t.c409, t.soldout, t.exhausted, t.c4xx, t.c5xx, t.other,
		e.connect + e.read + e.write + e.timeout, t.wrapped, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
LUA

# --- 5. measuring ------------------------------------------------------------------
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; } # utime + stime of one process
machine() { head -n 1 /proc/stat | awk '{ print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6 }'; } # total, idle
pg_ticks() {
	local total=0 pid f
	for pid in $(pgrep -u postgres || true); do
		f=$(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null) || continue
		total=$((total + f))
	done
	echo "$total"
}
TCK=$(getconf CLK_TCK)
gc_count() { curl -fsS "$HTTP/metrics" 2>/dev/null | awk '/^go_gc_duration_seconds_count/ { print $2 }' || true; }
rss_mib() { awk -v k="$2" '$1 == k":" { printf "%d", $2 / 1024 }' "/proc/$1/status"; }
wait_quiet() { # >= 90 % idle over 3 s, at most a minute
	local a b i
	for i in $(seq 1 20); do
		read -r -a a < <(machine)
		sleep 3
		read -r -a b < <(machine)
		IDLE=$(((b[1] - a[1]) * 100 / (b[0] - a[0] > 0 ? b[0] - a[0] : 1)))
		((IDLE >= 90)) && return 0
	done
	say "the machine did not go quiet (idle $IDLE %); measuring anyway"
}

declare -A RATE LINE CPU CLIENT PG BUSY OTHER IDLE_BEFORE GCS RSS
ORDER=()
# run NAME OPS-FIELD COMMAND...: measure one variant; OPS-FIELD is the HB field of the count
# the rate is of (requests for wrk, created for reserves).
run() {
	local name=$1 opsf=$2 m0 m1 q0 q1 p0 p1 g0 g1 out ops secs
	shift 2
	wait_quiet
	IDLE_BEFORE[$name]=$IDLE
	say "measuring $name (machine $IDLE % idle before)"
	read -r -a m0 < <(machine)
	q0=$(cpu_ticks "$QUOTAD")
	p0=$(pg_ticks)
	g0=$(gc_count)
	local TIMEFORMAT='%U %S' perf=""
	if [[ -n $PERF_DIR ]]; then # stops by itself when quotad exits, should this row fail
		perf record -q -F 499 -g -p "$QUOTAD" -o "$PERF_DIR/$name.perf.data" >"$WORK/perf.log" 2>&1 &
		perf=$!
	fi
	{ time timeout $((DURATION + 60)) "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"; } 2>"$WORK/time.txt" ||
		{ cat "$WORK/err.txt" >&2; die "$name failed"; }
	if [[ -n $perf ]]; then
		kill -INT "$perf" 2>/dev/null || true
		wait "$perf" || true # perf answers SIGINT with a non-zero status
		[[ -s $PERF_DIR/$name.perf.data ]] || say "no profile of $name: $(tail -n 1 "$WORK/perf.log")"
	fi
	read -r -a m1 < <(machine)
	q1=$(cpu_ticks "$QUOTAD")
	p1=$(pg_ticks)
	g1=$(gc_count)
	GCS[$name]=$([[ -n $g0 && -n $g1 ]] && echo $((g1 - g0)) || echo "?")
	RSS[$name]=$(rss_mib "$QUOTAD" VmRSS)
	out=$(grep '^HB ' "$WORK/out.txt" | tail -n 1)
	[[ -n $out ]] || { cat "$WORK/out.txt" "$WORK/err.txt" >&2; die "$name printed no result"; }
	LINE[$name]=$out
	ops=$(field "$out" "$opsf")
	secs=$(field "$out" seconds)
	RATE[$name]=$(awk -v o="$ops" -v s="$secs" 'BEGIN { printf "%.0f", o / s }')
	local all
	all=$(field "$out" requests)
	[[ -n $all ]] || all=$(field "$out" calls)
	[[ -n $all ]] || all=$(field "$out" buyers)
	all=$((all > 0 ? all : 1))
	CPU[$name]=$(awk -v t=$((q1 - q0)) -v k="$TCK" -v n="$all" 'BEGIN { printf "%.1f", t / k * 1e6 / n }')
	# (a backend of another database that exits meanwhile takes its ticks along: "?")
	PG[$name]=$(awk -v t=$((p1 - p0)) -v k="$TCK" -v n="$all" 'BEGIN { if (t < 0) print "?"; else printf "%.1f", t / k * 1e6 / n }')
	CLIENT[$name]=$(awk -v n="$all" '{ printf "%.1f", ($1 + $2) * 1e6 / n }' "$WORK/time.txt")
	BUSY[$name]=$(((m1[0] - m0[0] - (m1[1] - m0[1])) * 100 / (m1[0] - m0[0] > 0 ? m1[0] - m0[0] : 1)))
	# The machine's busy time not spent by quotad, the client or PostgreSQL: other work that
	# competed with this variant (0 on a quiet machine, but for the kernel's own).
	OTHER[$name]=$(awk -v tot=$((m1[0] - m0[0])) -v busy=$((m1[0] - m0[0] - (m1[1] - m0[1]))) -v q=$((q1 - q0)) -v p=$((p1 - p0)) -v k="$TCK" \
		'{ if (p < 0) p = 0; o = busy - q - p - ($1 + $2) * k; if (o < 0) o = 0; printf "%.0f", (tot > 0 ? o * 100 / tot : 0) }' "$WORK/time.txt")
	ORDER+=("$name")
	printf '%s\n' "$out" >&2
	if [[ -s $WORK/err.txt ]]; then sed 's/^/  /' "$WORK/err.txt" >&2; fi
}
WRK=(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --timeout 10s -s "$WORK/hb.lua" "$HTTP" --)

# Cheap variants first, each between two pings (its ratio is over their mean: the machine's
# speed drifts by tens of percent from one minute to the next here); then the reserves, the
# HTTP one between the gRPC ones (each after the state the earlier ones left: more holds).
run ping1 requests "${WRK[@]}" ping - x x "$THREADS"
run poll requests "${WRK[@]}" poll "$WORK/poll.ids" "$S-poll" a "$THREADS"
run ping2 requests "${WRK[@]}" ping - x x "$THREADS"
run poll_admitted requests "${WRK[@]}" poll "$WORK/polla.ids" "$S-polla" a "$THREADS"
run ping3 requests "${WRK[@]}" ping - x x "$THREADS"
run soldout requests "${WRK[@]}" soldout "$WORK/soldout.tickets" "$S-soldout" a "$THREADS"
run ping4 requests "${WRK[@]}" ping - x x "$THREADS"
run grpc_loadgen granted "$HB" loadgen -grpc "$GRPC" -sale "$S-lg" -sku a -concurrency "$CONNS" -duration "${DURATION}s"
run grpc_reserve created "$HB" reserve -grpc "$GRPC" -sale "$S-grpc" -sku a -tickets "$WORK/grpc.tickets" \
	-concurrency "$CONNS" -duration "${DURATION}s"
run http_reserve s201 "${WRK[@]}" reserve "$WORK/http.tickets" "$S-http" a "$THREADS"
run grpc_reserve8 created "$HB" reserve -grpc "$GRPC" -sale "$S-grpc8" -sku a -tickets "$WORK/grpc8.tickets" \
	-concurrency "$CONNS" -duration "${DURATION}s" -conns 8

# --- 6. the table -----------------------------------------------------------------------
answers() {
	local l=${LINE[$1]} out="" k v
	for k in s200 s201 s202 sold_out region_exhausted s4xx s5xx other socket_errors created replayed granted exhausted failed refused; do
		v=$(field "$l" "$k")
		[[ -n $v && $v != 0 ]] && out+="$k=$v "
	done
	echo "${out% }"
}
label() {
	case $1 in
	ping*) echo "GET /v1/ping (no-op handler)" ;;
	poll) echo "(2) GET admission, queued" ;;
	poll_admitted) echo "(2) GET admission, admitted" ;;
	soldout) echo "(1) POST reservation, sold out" ;;
	grpc_loadgen) echo "gRPC Reserve, no room (loadgen)" ;;
	grpc_reserve) echo "gRPC Reserve with ticket" ;;
	grpc_reserve8) echo "gRPC Reserve with ticket, 8 conns" ;;
	http_reserve) echo "(3) POST reservation (201)" ;;
	esac
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }'; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN { if (r >= t) print "met"; else printf "MISSED (%.1f %% short)\n", (t - r) / t * 100 }'; }

echo
echo "http-bench: quotad dev --insecure (plaintext HTTP/1.1 and h2c gRPC, no client certificates), region us alone"
echo "http-bench: quotad dev flags added: ${QUOTAD_FLAGS[*]:-none} (its Go memory limit: $(curl -fsS "$HTTP/metrics" 2>/dev/null | awk '/^go_gc_gomemlimit_bytes/ { printf "%.0f MiB", $2 / 1048576 }'))"
echo "http-bench: wrk -t$THREADS -c$CONNS -d${DURATION}s; gRPC: $CONNS callers on one connection (and on 8) for ${DURATION}s"
echo "http-bench: $(nproc) CPUs, $(uname -r), $(go version | awk '{ print $3 }'), commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "http-bench: sold-out probe answered: $SOLDOUT_ANSWER"
echo
printf '%-34s %9s %8s %8s %8s %9s %9s %6s %6s %6s %4s %6s  %s\n' variant ops/s p50_ms p99_ms quotad_us client_us pg_us busy% other% idle0 gcs rss_mb answers
for n in "${ORDER[@]}"; do
	l=${LINE[$n]}
	printf '%-34s %9s %8s %8s %8s %9s %9s %6s %6s %6s %4s %6s  %s\n' "$(label "$n")" "${RATE[$n]}" "$(field "$l" p50_ms)" "$(field "$l" p99_ms)" \
		"${CPU[$n]}" "${CLIENT[$n]}" "${PG[$n]}" "${BUSY[$n]}" "${OTHER[$n]}" "${IDLE_BEFORE[$n]}" "${GCS[$n]}" "${RSS[$n]}" "$(answers "$n")"
done
echo "(ops/s: requests/s for wrk rows, reservations made/s for reserve rows; *_us: CPU µs per request of quotad,"
echo " of the load client (wrk or the Go helper) and of PostgreSQL (all its processes); busy%: the whole machine"
echo " during the run; other%: of the machine, busy but not in quotad, the client or PostgreSQL (other work that"
echo " competed: ~0 on a quiet machine); idle0: idle % in the 3 s before it; gcs: quotad's Go collections during"
echo " it (its /metrics; ? without); rss_mb: quotad's resident memory after it; no p50/p99 for the gRPC rows)"
echo
mean() { echo $((($1 + $2) / 2)); }
PING_POLL=$(mean "${RATE[ping1]}" "${RATE[ping2]}")
PING_POLLA=$(mean "${RATE[ping2]}" "${RATE[ping3]}")
PING_SOLDOUT=$(mean "${RATE[ping3]}" "${RATE[ping4]}")
r1=$(ratio "${RATE[soldout]}" "$PING_SOLDOUT")
r2=$(ratio "${RATE[poll]}" "$PING_POLL")
r2a=$(ratio "${RATE[poll_admitted]}" "$PING_POLLA")
r3=$(ratio "${RATE[http_reserve]}" "${RATE[grpc_reserve]}")
r38=$(ratio "${RATE[http_reserve]}" "${RATE[grpc_reserve8]}")
r3l=$(ratio "${RATE[http_reserve]}" "${RATE[grpc_loadgen]}")
echo "ping: each ratio of (1) and (2) is over the mean of the pings just before and after it"
printf '%-58s %7s %7s  %s\n' ratio target value ""
printf '%-58s %7s %7s  %s\n' "(1) sold-out POST / ping ($PING_SOLDOUT)" ">= 0.70" "$r1" "$(verdict "$r1" 0.70)"
printf '%-58s %7s %7s  %s\n' "(2) admission poll (queued) / ping ($PING_POLL)" ">= 0.70" "$r2" "$(verdict "$r2" 0.70)"
printf '%-58s %7s %7s  %s\n' "(2) admission poll (admitted) / ping ($PING_POLLA)" ">= 0.70" "$r2a" "$(verdict "$r2a" 0.70)"
printf '%-58s %7s %7s  %s\n' "(3) HTTP reserve / gRPC reserve with ticket" ">= 0.60" "$r3" "$(verdict "$r3" 0.60)"
printf '%-58s %7s %7s  %s\n' "(3) HTTP reserve / gRPC reserve with ticket, 8 conns" ">= 0.60" "$r38" "$(verdict "$r38" 0.60)"
printf '%-58s %7s %7s  %s\n' "(3) HTTP reserve / gRPC reserve without room (loadgen)" ">= 0.60" "$r3l" "$(verdict "$r3l" 0.60)"
for n in grpc_reserve grpc_reserve8; do
	[[ $(field "${LINE[$n]}" exhausted_tickets) == true ]] &&
		echo "note: $n used all its $TICKETS tickets before ${DURATION}s; its rate is over the time it ran"
done
(($(field "${LINE[http_reserve]}" wrapped) > 0)) &&
	echo "WARNING: the HTTP reserve ran out of its $TICKETS tickets (replays counted as nothing): its rate is low; shorten HTTP_BENCH_DURATION"
[[ $SOLDOUT_ANSWER == *SOLD_OUT* ]] || echo "note: the sold-out SKU was not flagged SOLD_OUT yet; (1) measured REGION_EXHAUSTED"
# Each variant must have answered what it measures, every time.
check() { # name field: every request of the variant answered with field
	local l=${LINE[$1]}
	[[ $(field "$l" "$2") == "$(field "$l" requests)" ]] || echo "CHECK FAILED: not every answer of $1 was $2: $(answers "$1")"
}
for n in ping1 ping2 ping3 ping4; do check "$n" s200; done
check poll_admitted s200
check soldout s409
l=${LINE[poll]}
(($(field "$l" s200) + $(field "$l" s202) == $(field "$l" requests))) || echo "CHECK FAILED: poll answered other than 200/202: $(answers poll)"
l=${LINE[http_reserve]}
(($(field "$l" s201) + $(field "$l" s200) == $(field "$l" requests))) || echo "CHECK FAILED: the HTTP reserve answered other than 201: $(answers http_reserve)"
for n in grpc_reserve grpc_reserve8; do
	[[ $(field "${LINE[$n]}" created) == "$(field "${LINE[$n]}" calls)" ]] || echo "CHECK FAILED: $n: $(answers "$n")"
done
exit 0
