package main

import (
	"fmt"

	"github.com/quotaworks/quota/internal/wanlink"
	"github.com/spf13/cobra"
)

// maxRoutes bounds the links one wanproxy serves.
const maxRoutes = 256

// wanproxyCmd is deploy/local's delay links (cluster up --wan): one process serving every
// route between the regions of a cluster on one machine. Hidden: a test and demo tool, never
// a production component.
func wanproxyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "wanproxy",
		Short:  "Serve TCP links that delay every byte by a one-way delay and jitter (deploy/local's --wan)",
		Hidden: true,
		Example: `  quotad wanproxy --route 'us>eu/etcd2=127.0.0.1:7411=127.0.0.1:7582=40ms=3ms' \
    --route 'us>ap/etcd3=127.0.0.1:7412=127.0.0.1:7583=80ms=3ms'`,
		Args: cobra.NoArgs,
		RunE: runWanproxy,
	}
	cmd.Flags().StringArray("route", nil, "a link as name=listen=upstream=delay[=jitter] (repeat; at least one)")
	return cmd
}

func runWanproxy(cmd *cobra.Command, _ []string) error {
	v, log, err := settings(cmd)
	if err != nil {
		return badUsage(err)
	}
	specs := v.GetStringSlice("route")
	if len(specs) == 0 || len(specs) > maxRoutes {
		return badUsage(fmt.Errorf("route: %d given, want 1 to %d", len(specs), maxRoutes))
	}
	routes := make([]wanlink.Route, 0, len(specs))
	for _, s := range specs {
		r, err := wanlink.ParseRoute(s)
		if err != nil {
			return badUsage(err)
		}
		routes = append(routes, r)
	}
	ctx, stop := signalContext()
	defer stop()
	links := make([]*wanlink.Link, 0, len(routes))
	defer func() {
		for _, l := range links {
			l.Close()
		}
	}()
	for _, r := range routes {
		l, err := wanlink.Listen(r)
		if err != nil {
			return err
		}
		links = append(links, l)
		log.Info("wan link", "name", r.Name, "listen", r.Listen, "upstream", r.Upstream, "delay", r.Delay, "jitter", r.Jitter)
	}
	fmt.Printf("quotad wanproxy: %d links\n", len(links))
	<-ctx.Done()
	log.Info("wanproxy stopping")
	return nil
}
