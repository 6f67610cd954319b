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
		"admit-rate", "allocate", "audit-interval", "base-port", "batch-window", "buckets", "buyers", "certs-dir", "client-url", "cluster-token",
		"concurrency", "config", "confirm", "coordinator", "cpuprofile", "data-dir", "db-prefix",
		"db-url", "dry-run", "duration", "etcd", "file", "etcd-log-level", "from", "gc-percent", "help",
		"hold", "hold-ttl", "horizon", "host", "http", "http-listen", "initial-cluster", "insecure", "key", "lease-ttl", "listen",
		"log-level", "max-batch", "max-keys-per-user", "max-live-tickets", "max-duration", "memory-limit", "memprofile", "min-units", "name",
		"opens-at", "output", "overwrite", "payment", "peer-url", "per-user-limit", "pg-url", "probe-ops",
		"quantity", "reason", "refuse", "region", "regions", "release", "retain-closed", "request-id", "role", "rounds", "sale", "seed",
		"skew", "sku", "sql-conns", "standby-refresh", "stock", "strand-after", "sweep-interval", "ticket-keys", "ticket-ttl", "timeout", "to",
		"unfinished", "units", "user", "user-prefix", "variants", "verify", "wait", "waitlist", "warmup",
		"warmup-ops", "window",
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
