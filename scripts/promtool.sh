#!/usr/bin/env bash
# Checks deploy/prometheus with promtool (make metrics-check; a step of make test):
#
#  - installs Debian's prometheus package (which ships promtool) when promtool is missing
#  - promtool check config deploy/prometheus/prometheus.yml, on a copy beside placeholder
#    certificate files: promtool insists that the files tls_config names exist, and a fresh
#    checkout has no .dev/certs until quotad dev first runs
#  - promtool check rules deploy/prometheus/alerts.yml
#  - promtool test rules deploy/prometheus/alerts_test.yml (the alerts' unit tests)
#  - every query of deploy/grafana/quota.json parses as PromQL: they are written out as
#    recording rules, Grafana's variables replaced by values, for promtool check rules
#
# That every metric the rules and deploy/grafana/quota.json name is really exported, and that
# every process's /metrics passes promtool check metrics, is TestMetricsOfADevCluster's part
# (cmd/internal/cluster). With --install it only installs promtool. Safe to run any number of
# times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'promtool: %s\n' "$*"; }
die() { printf 'promtool: ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
	if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n -- "$@"; fi
}

if ! command -v promtool >/dev/null 2>&1; then
	log "installing Debian's prometheus package (for promtool)"
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get update -qq || die "apt-get update failed"
	# The package's service is not started: policy-rc.d or the lack of an init decides that,
	# and nothing here needs the server.
	as_root apt-get install -y -qq --no-install-recommends prometheus >/dev/null || die "apt-get install prometheus failed"
fi
promtool --version 2>&1 | head -n 1
# --install: only make sure promtool is here (make test does it before the Go tests, whose
# TestMetricsOfADevCluster runs promtool check metrics on every process's /metrics).
if [[ "${1:-}" == "--install" ]]; then
	exit 0
fi

dir=deploy/prometheus
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/$dir" "$tmp/.dev/certs"
cp "$dir/prometheus.yml" "$dir/alerts.yml" "$tmp/$dir/"
for f in ca.crt client.auditor.crt client.auditor.key; do
	: >"$tmp/.dev/certs/$f"
done

# The dashboard's queries as recording rules (python3 reads the JSON: Debian's images ship it).
python3 - deploy/grafana/quota.json >"$tmp/dashboard-rules.yml" <<'PY'
import json, sys
subst = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m", "$region": ".*", "$sale": ".*"}
exprs = []
def walk(v):
    if isinstance(v, dict):
        for k, e in v.items():
            if k == "expr" and isinstance(e, str):
                exprs.append(e)
            walk(e)
    elif isinstance(v, list):
        for e in v:
            walk(e)
walk(json.load(open(sys.argv[1])))
if not exprs:
    sys.exit("no expr in " + sys.argv[1])
print("groups:\n  - name: dashboard\n    rules:")
for i, e in enumerate(exprs):
    for k, v in subst.items():
        e = e.replace(k, v)
    print("      - record: dashboard:query%d\n        expr: %s" % (i, json.dumps(e)))
PY

fail=0
promtool check config "$tmp/$dir/prometheus.yml" || fail=1
promtool check rules "$dir/alerts.yml" || fail=1
promtool test rules "$dir/alerts_test.yml" || fail=1
echo "Checking the queries of deploy/grafana/quota.json"
promtool check rules "$tmp/dashboard-rules.yml" || fail=1
((fail == 0)) || die "deploy/prometheus or the dashboard: a check failed (above)"
log "ok"
