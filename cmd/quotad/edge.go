package main

import (
	"fmt"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/spf13/cobra"
)

func edgeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "edge",
		Args:  cobra.NoArgs, // a stray word (a flag without its dashes) must not start a server on defaults
		Short: "Run a storefront edge of a region: its storefront HTTP API, without leading it",
		Long: `Run a storefront edge of one region (docs/storefront.md, "Edges"): it serves the region's
storefront HTTP/JSON API (the same routes, roles and answers as the region's own HTTP edge,
docs/openapi.yaml) without leading the region. It answers buyers' polls of the waiting line
from a copy of each sale's line that it keeps from the region's leader (fetched again --refresh
after each answer, and answered by the leader as soon as the line changes),
signs admitted buyers' tickets with the cluster's ticket keys as the leader does, refuses
entries to a sold-out or paused line itself and checks tickets' signatures; it forwards
entering the line, reserving, confirming, releasing, the waitlist and the sale's page to the
region's leader over gRPC, as a storefront (client.storefront.crt). It finds the leader among
the --upstream addresses and follows NOT_LEADER answers to the next one by itself. With
--room-listen it serves the region's waiting-room page for shoppers' browsers too, as
quotad region --room-listen does (docs/storefront.md, "The waiting-room page").

Its state is soft: kill it and start it again at any time, run as many as the polls need;
a storefront that loses one retries against another with the same request keys.`,
		Example: `  quotad edge --region us --upstream 127.0.0.1:7401,127.0.0.1:7411 --listen 127.0.0.1:8601 \
    --ticket-keys .dev/tickets.keys --certs-dir .dev/certs`,
		RunE: runEdge,
	}
	f := cmd.Flags()
	f.String("region", "", "the region's name (required)")
	f.StringSlice("upstream", nil, "the gRPC addresses of the region's processes, leader and standbys (required; comma-separated\n"+
		"or repeated): the edge calls whichever leads")
	f.String("listen", "127.0.0.1:8601", "the storefront HTTP/JSON address; /metrics serves the edge's Prometheus metrics")
	f.String("room-listen", "", "the waiting-room page's public HTTPS address, for shoppers' browsers: a server certificate only,\n"+
		"no client certificate asked (none when empty)")
	f.Bool("reuse-port", false, "listen with SO_REUSEPORT (Linux), so that several edges of the region serve one --listen address\n"+
		"(and one --room-listen): the kernel spreads new connections among the live ones, and when one dies the others take\n"+
		"its new connections")
	f.String("ticket-keys", "", "the cluster's ticket key file (quotactl ticket-keys create), read again when it changes (required)")
	f.Duration("refresh", 0, "how long after each answer a sale's waiting line is fetched again from the leader, which answers\n"+
		"as soon as the line changes (holding a fetch that would bring nothing new up to 2s); a poll's answer is\n"+
		"at most this much behind the leader's (0: 250ms; at least 10ms)")
	f.Duration("max-stale", 0, "how old a line's copy may be for polls to be answered from it; past it (the leader unreachable\n"+
		"that long) polls go to the leader (0: 30s, longer than a failover)")
	addSecurityFlags(cmd, "(required unless --insecure; node.crt serves storefronts, client.storefront.crt calls the region)")
	addConnectionFlags(cmd)
	return cmd
}

// EdgeProcessConfig is `quotad edge`'s configuration.
type EdgeProcessConfig struct {
	Node cluster.EdgeConfig
}

// Validate checks the configuration, naming the bad key.
func (c *EdgeProcessConfig) Validate() error {
	if err := c.Node.Validate(); err != nil {
		return err
	}
	if r := c.Node.Refresh; r != 0 && r < minEdgeRefresh {
		return fmt.Errorf("refresh %s: must be at least %s (0: the default)", r, minEdgeRefresh)
	}
	if s := c.Node.MaxStale; s != 0 && s < c.Node.Refresh {
		return fmt.Errorf("max-stale %s: must be at least the refresh %s", s, c.Node.Refresh)
	}
	return nil
}

const minEdgeRefresh = 10 * time.Millisecond // as regionedge.Config's floor

func runEdge(cmd *cobra.Command, _ []string) error {
	v, log, err := settings(cmd)
	if err != nil {
		return badUsage(err)
	}
	tlsm, err := security(v, log)
	if err != nil {
		return badUsage(err)
	}
	limits, err := connectionLimits(v)
	if err != nil {
		return badUsage(err)
	}
	cfg := EdgeProcessConfig{Node: cluster.EdgeConfig{Region: v.GetString("region"), Upstream: v.GetStringSlice("upstream"),
		Listen: v.GetString("listen"), RoomListen: v.GetString("room-listen"), ReusePort: v.GetBool("reuse-port"), TicketKeys: v.GetString("ticket-keys"), Refresh: v.GetDuration("refresh"),
		MaxStale: v.GetDuration("max-stale"), TLS: tlsm, Limits: limits, Logger: log}}
	if err := cfg.Validate(); err != nil {
		return badUsage(err)
	}
	ctx, stop := signalContext()
	defer stop()
	n, err := cluster.StartEdge(cfg.Node)
	if err != nil {
		return err
	}
	defer n.Close()
	fmt.Printf("quotad edge of region %s: %s\n", cfg.Node.Region, n.Addr())
	<-ctx.Done()
	return nil
}
