package main

import (
	"testing"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
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
