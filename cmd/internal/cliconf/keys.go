package cliconf

import (
	"sort"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// programKeys are the flag names of quotad and quotactl together: the keys a config file may
// have. Both programs read QUOTA_CONFIG, so one file may carry settings of either; a key in
// neither is a mistake (checkKeys). Each program's tests check (MissingKeys) that every flag
// it has is listed here.
var programKeys = map[string]bool{}

func init() {
	for _, k := range []string{
		"actions", "admit-rate", "after", "allocate", "allocation", "audit-interval", "audit-retention", "auto-rebalance", "base-port", "batch-window", "buckets", "buyers", "cart", "certs-dir", "client-url", "cluster-token",
		"concurrency", "config", "confirm", "console-keys", "coordinator", "cpuprofile", "data-dir", "db-prefix", "demand",
		"db-url", "dry-run", "duration", "etcd", "etcd-log-level", "expect-head", "from", "gc-percent", "grpc-gateway", "help", "identity",
		"hold", "hold-ttl", "horizon", "host", "http", "http-listen", "initial-cluster", "insecure", "lease-ttl", "limit", "limits", "listen",
		"log-level", "max-batch", "max-connections", "max-connections-per-cert", "max-connections-per-ip", "max-keys-per-user", "max-live-tickets", "memory-limit", "memprofile", "min-units", "name",
		"opens-at", "operator-after", "output", "overwrite", "payment", "peer-url", "per-user-limit", "plan", "pg-url", "probe-ops",
		"quantity", "rate", "reason", "rebalance", "rebalance-cooldown", "rebalance-every", "rebalance-horizon", "rebalance-max-in-flight",
		"rebalance-min-units", "rebalance-window", "redis-server", "refuse", "region", "regions", "release", "retain-closed", "request-key", "role", "room", "room-listen", "room-return-url", "rounds", "sale", "seed", "since",
		"skew", "sku", "sql-conns", "standby-refresh", "stock", "strand-after", "sweep-interval", "ticket-keys", "ticket-ttl", "timeout", "to", "ttl",
		"unfinished", "units", "user", "user-prefix", "variants", "verify", "wait", "waitlist", "warmup",
		"warmup-ops", "window",
		"audit-holds", "audit-runs", "closed-holds", "curve-timeout", "curves", "idle-window", "idle-skus", "live-ops", "pool-ops", "pools", "sales", "takeover-live", "takeover-runs", "transfers", "transfers-in-flight",
		"transfers-via-coordinator", "cert-warn", "advertise", "edges", "upstream", "refresh", "max-stale",
		"listen-peer-url", "route", "reuse-port",
		// Deprecated names (Alias), gone with their aliases in the next release: docs/cli.md.
		"file", "key", "keys", "max-duration", "request-id",
	} {
		programKeys[k] = true
	}
}

// flagNames are the names of every flag of every command under root.
func flagNames(root *cobra.Command) map[string]bool {
	names := map[string]bool{}
	var visit func(c *cobra.Command)
	visit = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { names[f.Name] = true })
		}
		for _, sub := range c.Commands() {
			visit(sub)
		}
	}
	visit(root)
	return names
}

// MissingKeys are the flags of the program under root that programKeys does not list, sorted.
func MissingKeys(root *cobra.Command) []string {
	var missing []string
	for name := range flagNames(root) {
		if !programKeys[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	return missing
}
