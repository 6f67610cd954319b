package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/quotaworks/quota/internal/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/spf13/cobra"
)

func loadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Drive simulated buyers at a sale through the regions (the demo's flash sale)",
		Long: `load sends --buyers distinct buyers, --concurrency at a time, each to its nearest region
(picked by --skew weights). Each buyer reserves with an idempotency key, retries the same
request when the outcome is unknown, then pays (--confirm), cancels (--release) or walks
away and lets the hold expire. Progress is printed every second to stderr.`,
		Example: `  quotactl load --sale launch --sku phone --buyers 50000 --concurrency 1000 --skew us=60,eu=25,ap=15`,
		Args:    cobra.NoArgs,
		RunE:    withEnv(runLoad),
	}
	f := cmd.Flags()
	f.String("sale", "", "sale id (required)")
	f.String("sku", "", "SKU (required)")
	f.Int("buyers", 50000, "how many buyers arrive")
	f.Int("concurrency", 1000, "buyers in flight at once")
	f.String("skew", "us=60,eu=25,ap=15", "share of buyers nearest to each region")
	f.Float64("confirm", 0.85, "fraction of holds paid for")
	f.Float64("release", 0.05, "fraction of holds cancelled; the rest are abandoned and expire")
	f.Duration("max-duration", 5*time.Minute, "stop after this long (0 means 10m)")
	f.Uint64("seed", 1, "random seed")
	f.String("user-prefix", "", "prefix of buyer ids; default <sale>-s<seed>- (the same seed replays the same buyers)")
	return cmd
}

type loadJSON struct {
	Buyers       int64            `json:"buyers"`
	Granted      int64            `json:"granted"`
	UnitsGranted int64            `json:"units_granted"`
	PerRegion    map[string]int64 `json:"units_per_region"`
	Exhausted    int64            `json:"region_exhausted"`
	SoldOut      int64            `json:"sold_out"`
	Limited      int64            `json:"limit_exceeded"`
	Paused       int64            `json:"paused"`
	Failed       int64            `json:"failed"`
	FirstError   string           `json:"first_error,omitempty"`
	Earlier      int64            `json:"replayed_from_earlier_run,omitempty"`
	Retries      int64            `json:"retries"`
	Confirmed    int64            `json:"confirmed"`
	Refunded     int64            `json:"refunded"`
	Released     int64            `json:"released"`
	Abandoned    int64            `json:"abandoned"`
	Seconds      float64          `json:"seconds"`
	PerSecond    float64          `json:"reserves_per_second"`
}

func runLoad(e *env) error {
	names, weights, err := parsePairs("skew", []string{e.v.GetString("skew")})
	if err != nil {
		return err
	}
	cfg := loadgen.Config{Sale: e.v.GetString("sale"), SKU: e.v.GetString("sku"), Buyers: e.v.GetInt("buyers"),
		Concurrency: e.v.GetInt("concurrency"), ConfirmRatio: e.v.GetFloat64("confirm"), ReleaseRatio: e.v.GetFloat64("release"),
		MaxDuration: e.v.GetDuration("max-duration"), Seed: e.v.GetUint64("seed"), UserPrefix: e.v.GetString("user-prefix")}
	var invalid *loadgen.InvalidError
	if err := cfg.CheckSettings(); errors.As(err, &invalid) { // loadgen names its settings as their flags
		return usage("--%s %s: %s", invalid.Field, invalid.Value, invalid.Want)
	} else if err != nil {
		return usage("%v", err)
	}
	if cfg.Creds, err = e.creds(); err != nil {
		return err
	}
	rs, err := e.regions()
	if err != nil {
		return err
	}
	if cfg.UserPrefix == "" {
		cfg.UserPrefix = fmt.Sprintf("%s-s%d-", cfg.Sale, cfg.Seed)
	}
	for i, n := range names {
		r, err := findRegion(rs, "skew", n)
		if err != nil {
			return err
		}
		cfg.Regions = append(cfg.Regions, loadgen.Region{Name: n, Addr: r.GetAddress(), Weight: weights[i]})
	}
	coord, err := e.coordinator()
	if err != nil {
		return err
	}
	cfg.Resolve = func(ctx context.Context, region string) string {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := coord.ListRegions(ctx, &quotav1.ListRegionsRequest{})
		for _, r := range resp.GetRegions() {
			if err == nil && r.GetName() == region {
				return r.GetAddress()
			}
		}
		return ""
	}
	cfg.Progress = func(s loadgen.Stats) {
		fmt.Fprintf(os.Stderr, "  %5.1fs  buyers %6d  granted %6d  exhausted %6d  limited %d  confirmed %6d  refunded %d  failed %d  units %s\n",
			s.Elapsed.Seconds(), s.Buyers, s.Granted, s.Exhausted, s.Limited, s.Confirmed, s.Refunded, s.Failed, perRegion(s.PerRegion))
	}
	s, err := loadgen.Run(e.cmd.Context(), cfg)
	if err != nil {
		return usage("%v", err)
	}
	out := loadJSON{Buyers: s.Buyers, Granted: s.Granted, UnitsGranted: s.UnitsGranted, PerRegion: s.PerRegion, Exhausted: s.Exhausted,
		SoldOut: s.SoldOut, Limited: s.Limited, Failed: s.Failed, Retries: s.Retries, Confirmed: s.Confirmed, Refunded: s.Refunded,
		Released: s.Released, Abandoned: s.Abandoned, Seconds: s.Elapsed.Seconds(), PerSecond: float64(s.Buyers) / s.Elapsed.Seconds(),
		FirstError: s.FirstError, Earlier: s.Earlier, Paused: s.Paused}
	err = e.print(out, func(w io.Writer) { printLoadText(w, out, s.Elapsed) })
	if err == nil && out.Failed > 0 && out.Granted+out.Exhausted+out.SoldOut+out.Limited+out.Paused+out.Earlier == 0 {
		return fmt.Errorf("every reserve failed; the first: %s", out.FirstError)
	}
	return err
}

// perRegion renders units per region as "ap 75, eu 109, us 124", by region name.
func perRegion(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, r := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", r, m[r]))
	}
	return strings.Join(parts, ", ")
}

// printLoadText is a load's totals as text.
func printLoadText(w io.Writer, out loadJSON, elapsed time.Duration) {
	fmt.Fprintf(w, "%d buyers in %s (%.0f reserves/s): %d granted (%d units: %s), %d told region exhausted, %d sold out, %d over limit, %d failed\n",
		out.Buyers, elapsed.Round(time.Millisecond), out.PerSecond, out.Granted, out.UnitsGranted, perRegion(out.PerRegion), out.Exhausted, out.SoldOut, out.Limited, out.Failed)
	fmt.Fprintf(w, "holds: %d paid, %d refunded, %d cancelled, %d abandoned (expire after the hold ttl); %d retries\n",
		out.Confirmed, out.Refunded, out.Released, out.Abandoned, out.Retries)
	if out.Paused > 0 {
		fmt.Fprintf(w, "%d buyers told the sale or SKU is paused (PAUSED)\n", out.Paused)
	}
	if out.Earlier > 0 {
		fmt.Fprintf(w, "%d buyers already had a hold from an earlier run with the same buyer ids (replayed, not counted above)\n", out.Earlier)
	}
	if out.FirstError != "" {
		fmt.Fprintf(w, "first failure: %s\n", out.FirstError)
	}
}
