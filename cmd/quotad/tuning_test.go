package main

import (
	"testing"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/region"
)

// TestMaxKeysPerUserReachesTheRegionConfig: --max-keys-per-user of quotad region and quotad
// dev becomes region.Config.MaxKeysPerUser, and without it the config has the region's default.
func TestMaxKeysPerUserReachesTheRegionConfig(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int32
	}{
		{[]string{"dev", "--max-keys-per-user", "7"}, 7},
		{[]string{"region", "--name", "us", "--max-keys-per-user", "12345"}, 12345},
		{[]string{"dev"}, region.DefaultMaxKeysPerUser},
		{[]string{"region", "--name", "us"}, region.DefaultMaxKeysPerUser},
	} {
		cmd, rest, err := rootCmd().Find(tc.args)
		if err != nil {
			t.Fatalf("quotad %v: %v", tc.args, err)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Fatalf("quotad %v: %v", tc.args, err)
		}
		v, err := cliconf.Bind(cmd)
		if err != nil {
			t.Fatalf("quotad %v: %v", tc.args, err)
		}
		rc, err := regionTuning(v)
		if err != nil {
			t.Fatalf("quotad %v: %v", tc.args, err)
		}
		if rc.MaxKeysPerUser != tc.want {
			t.Errorf("quotad %v: MaxKeysPerUser %d, want %d", tc.args, rc.MaxKeysPerUser, tc.want)
		}
		if cmd.Name() == "dev" {
			dc, err := devConfig(v)
			if err != nil {
				t.Fatalf("quotad %v: %v", tc.args, err)
			}
			if dc.Region.MaxKeysPerUser != tc.want {
				t.Errorf("quotad %v: dev's region MaxKeysPerUser %d, want %d", tc.args, dc.Region.MaxKeysPerUser, tc.want)
			}
		}
	}
}

// TestConnectionFlagsReachTheLimits: --max-connections, --max-connections-per-ip and
// --max-connections-per-cert of every server command become its rpcserve.Limits (quotad
// dev's through its DevConfig), the defaults are rpcserve.DefaultLimits', and a bound out of
// its range is refused naming the flag.
func TestConnectionFlagsReachTheLimits(t *testing.T) {
	d := rpcserve.DefaultLimits
	for _, tc := range []struct {
		args []string
		want rpcserve.Limits
		err  string
	}{
		{[]string{"dev"}, rpcserve.Limits{MaxConnections: d.MaxConnections, MaxConnectionsPerIP: d.MaxConnectionsPerIP, MaxConnectionsPerCert: d.MaxConnectionsPerCert}, ""},
		{[]string{"dev", "--max-connections-per-ip", "300"}, rpcserve.Limits{MaxConnections: 1024, MaxConnectionsPerIP: 300, MaxConnectionsPerCert: 256}, ""},
		{[]string{"region", "--name", "us", "--max-connections", "4096", "--max-connections-per-ip", "2048", "--max-connections-per-cert", "9"},
			rpcserve.Limits{MaxConnections: 4096, MaxConnectionsPerIP: 2048, MaxConnectionsPerCert: 9}, ""},
		{[]string{"coordinator", "--max-connections-per-cert", "1"}, rpcserve.Limits{MaxConnections: 1024, MaxConnectionsPerIP: 64, MaxConnectionsPerCert: 1}, ""},
		{[]string{"region", "--max-connections-per-ip", "0"}, rpcserve.Limits{}, "max-connections-per-ip 0: must be 1..max-connections (1024)"},
		{[]string{"dev", "--max-connections-per-ip", "2000"}, rpcserve.Limits{}, "max-connections-per-ip 2000: must be 1..max-connections (1024)"},
		{[]string{"coordinator", "--max-connections-per-cert", "-1"}, rpcserve.Limits{}, "max-connections-per-cert -1: must be 1..max-connections (1024)"},
		{[]string{"dev", "--max-connections", "0"}, rpcserve.Limits{}, "max-connections 0: must be 1..65536"},
	} {
		cmd, rest, err := rootCmd().Find(tc.args)
		if err != nil {
			t.Fatalf("quotad %v: %v", tc.args, err)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Fatalf("quotad %v: %v", tc.args, err)
		}
		v, err := cliconf.Bind(cmd)
		if err != nil {
			t.Fatalf("quotad %v: %v", tc.args, err)
		}
		got, err := connectionLimits(v)
		if cmd.Name() == "dev" {
			var dc cluster.DevConfig
			dc, err = devConfig(v)
			got = dc.Limits
		}
		switch {
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("quotad %v: %v, want the error %q", tc.args, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("quotad %v: %v", tc.args, err)
		case tc.err == "" && got != tc.want:
			t.Errorf("quotad %v: %+v, want %+v", tc.args, got, tc.want)
		}
	}
}
