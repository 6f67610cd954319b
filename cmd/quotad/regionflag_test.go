package main

import (
	"testing"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
)

// TestCoordinatorRegionFlagKeepsMultiHostURLs: a --region whose database URL names both
// nodes of a database cluster (commas) reaches parseRegions whole, one region per flag.
func TestCoordinatorRegionFlagKeepsMultiHostURLs(t *testing.T) {
	cmd := coordinatorCmd()
	const (
		us = "postgres://quota_reader@127.0.0.1:7601,127.0.0.1:7611/quota_region_us?target_session_attrs=read-write"
		eu = "postgres://quota_reader@127.0.0.1:7602/quota_region_eu"
	)
	if err := cmd.Flags().Parse([]string{"--region", "us=127.0.0.1:7401=" + us, "--region", "eu=127.0.0.1:7402=" + eu}); err != nil {
		t.Fatal(err)
	}
	v, err := cliconf.Bind(cmd)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := parseRegions(v.GetStringSlice("region"))
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 || eps[0].DBURL != us || eps[1].DBURL != eu {
		t.Fatalf("regions %+v; want us at %s and eu at %s", eps, us, eu)
	}
}
