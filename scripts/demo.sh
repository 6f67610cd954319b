#!/usr/bin/env bash
# The demo behind `make demo`: start `quotad dev --edges 2` (embedded etcd, a coordinator,
# regions us, eu and ap, each with its own PostgreSQL database and two storefront edges in
# front of it, which answer the waiting room's polls and forward the rest to the region's
# leader), create a sale of 10,000 phones split 40/35/25 with a waiting room admitting 2,000
# buyers a second at each region, send 50,000 buyers at it through the edges (most nearest to
# us), each entering its region's waiting room at one of its region's edges, polling until
# admitted and reserving with its ticket: us sells
# fastest, and the coordinator's automatic rebalancer moves stock toward it from eu and ap
# while the first 9,000 buy (its plan and transfers are shown), the other 41,000 sell the rest
# (the rooms then answer SOLD_OUT); then abandoned holds expire, the rooms admit again, a last
# wave buys what expiry returned, and the audit ends it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

DATA=${QUOTA_DEMO_DIR:-.dev}
BUYERS=${BUYERS:-50000}
CONCURRENCY=${CONCURRENCY:-1000}
HOLD_TTL=${HOLD_TTL:-15s}
ADMIT_RATE=${ADMIT_RATE:-2000}
SALE="demo-$(date +%Y%m%d-%H%M%S)"
# Every load goes through the storefront edges, two per region (quotad dev --edges 2's ports,
# base+1201+8i+j), each buyer through one of its region's.
EDGES=us=https://127.0.0.1:8601,us=https://127.0.0.1:8602,eu=https://127.0.0.1:8609,eu=https://127.0.0.1:8610
EDGES+=,ap=https://127.0.0.1:8617,ap=https://127.0.0.1:8618
mkdir -p "$DATA"
# quotad dev makes the cluster's certificates there when missing; quotactl presents them.
export QUOTA_CERTS_DIR="$DATA/certs"

if ./bin/quotactl regions >/dev/null 2>&1; then
	echo "demo: something already answers on 127.0.0.1:7400; stop it first (is a quotad dev running?)" >&2
	exit 1
fi

echo "==> starting quotad dev with two storefront edges per region (log: $DATA/quotad.log)"
./bin/quotad dev --edges 2 --data-dir "$DATA" --db-prefix quota_demo >"$DATA/quotad.log" 2>&1 &
QUOTAD=$!
trap 'kill $QUOTAD 2>/dev/null; wait $QUOTAD 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
	if ./bin/quotactl regions >/dev/null 2>&1; then break; fi
	if ! kill -0 $QUOTAD 2>/dev/null; then
		echo "demo: quotad dev exited; its log:" >&2
		tail -n 30 "$DATA/quotad.log" >&2
		exit 1
	fi
	sleep 1
done
./bin/quotactl regions

echo
echo "==> creating sale $SALE: 10,000 phones, limit 2 per buyer, holds for $HOLD_TTL, split us=40 eu=35 ap=25,"
echo "    a waiting room at each region admitting $ADMIT_RATE buyers a second, each with a ticket for one reservation"
./bin/quotactl sale create --sale "$SALE" --sku phone=10000 --per-user-limit 2 --hold-ttl "$HOLD_TTL" \
	--admit-rate "$ADMIT_RATE" --allocate us=40,eu=35,ap=25

FIRST=$(( BUYERS * 9 / 50 ))
echo
echo "==> flash sale, first $FIRST of $BUYERS buyers, $CONCURRENCY at a time, nearest region us 60% / eu 25% / ap 15%"
echo "    through the storefront edges (two per region): each enters its region's waiting room, polls until"
echo "    admitted (the edges answer the polls), reserves with its ticket, then pays (85%), cancels (5%) or"
echo "    abandons the hold (10%)"
./bin/quotactl load --sale "$SALE" --sku phone --buyers "$FIRST" --concurrency "$CONCURRENCY" \
	--skew us=60,eu=25,ap=15 --confirm 0.85 --release 0.05 --seed 1 --http "$EDGES"

echo
echo "==> us sold fastest: the automatic rebalancer moved stock to it from eu and ap as it went"
./bin/quotactl stock --sale "$SALE"
./bin/quotactl transfers list --sale "$SALE"
echo
echo "==> the rebalancer's next step and why (quotactl rebalance --plan)"
./bin/quotactl rebalance --sale "$SALE" --plan

echo
echo "==> the other $(( BUYERS - FIRST )) buyers"
./bin/quotactl load --sale "$SALE" --sku phone --buyers "$(( BUYERS - FIRST ))" --concurrency "$CONCURRENCY" \
	--skew us=60,eu=25,ap=15 --confirm 0.85 --release 0.05 --seed 3 --http "$EDGES"

echo
echo "==> stock right after the rush"
./bin/quotactl stock --sale "$SALE"
./bin/quotactl transfers list --sale "$SALE"

echo
echo "==> waiting $HOLD_TTL (+2s) for abandoned holds to expire and return to their pools"
sleep "$(( ${HOLD_TTL%s} + 2 ))"
./bin/quotactl stock --sale "$SALE"

echo
echo "==> second wave: 5,000 late buyers, admitted again now that units came back, take what expiry returned; all pay"
./bin/quotactl load --sale "$SALE" --sku phone --buyers 5000 --concurrency 200 \
	--skew us=34,eu=33,ap=33 --confirm 1 --release 0 --seed 2 --http "$EDGES"

echo
echo "==> audit"
./bin/quotactl audit --sale "$SALE"
