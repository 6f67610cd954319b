package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
)

func loadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Drive simulated buyers at a sale through the regions (the demo's flash sale)",
		Long: `load sends --buyers distinct buyers, --concurrency at a time, each to its nearest region
(picked by --skew weights). Each buyer reserves with an idempotency key, retries the same
request when the outcome is unknown, then pays (--confirm), cancels (--release) or walks
away and lets the hold expire. Progress is printed every second to stderr.

By default buyers call the regions' gRPC API. With --http (each region's storefront
HTTP/JSON edge, as region=URL pairs) they go through the edge as a storefront's shoppers
would: enter the sale's waiting room (POST /v1/sales/{sale}/admissions), poll the admission
when its retry_after_ms says, reserve with the ticket they are given, then pay or cancel;
OVERLOADED (429) answers are retried after their Retry-After. Each buyer sends its own
synthetic address in X-Client-Address (the edge's per-address limit), which the edge honours
from the storefront certificate only. In a sale with a waiting room (sale create
--admit-rate) a reservation needs a ticket: load it with --http. A buyer is bound to the
first region that admits them for the sale: another region answers BOUND_ELSEWHERE.
With --waitlist, a buyer told SOLD_OUT (nothing available anywhere, though some may be
held) joins the SKU's waitlist (POST /v1/sales/{sale}/waitlist) and waits for an offer of
units that come back, as a release or an expiry, reserving with the offer's ticket. The
client presents the storefront certificate of --certs-dir over HTTP/2 (plaintext h2c under
--insecure: http:// URLs).

With --cart (SKU=quantity pairs, as reserve's --sku takes a cart, in place of --sku) each
buyer reserves a cart over gRPC: every line held (one hold per line, sharing a cart id) or
none; it then pays for or cancels the cart whole, by its cart id. The totals count the carts
granted and refused (by the SKU of the line that refused them, and why) besides the holds.`,
		Example: `  quotactl load --sale launch --sku phone --buyers 50000 --concurrency 1000 --skew us=60,eu=25,ap=15
  quotactl load --sale launch --sku phone --buyers 50000 --concurrency 1000 --skew us=60,eu=25,ap=15 \
    --http us=https://127.0.0.1:8401,eu=https://127.0.0.1:8402,ap=https://127.0.0.1:8403
  quotactl load --sale launch --cart phone=1,case=1 --buyers 5000 --concurrency 200`,
		Args: cobra.NoArgs,
		RunE: withEnv(runLoad),
	}
	f := cmd.Flags()
	f.String("sale", "", "sale id (required)")
	f.String("sku", "", "SKU (required, unless --cart)")
	f.String("cart", "", "reserve a cart in place of --sku: its lines as SKU=quantity pairs (phone=1,case=1), every line or none")
	f.Int("buyers", 50000, "how many buyers arrive")
	f.Int("concurrency", 1000, "buyers in flight at once")
	f.String("skew", "us=60,eu=25,ap=15", "share of buyers nearest to each region")
	f.Float64("confirm", 0.85, "fraction of holds paid for")
	f.Float64("release", 0.05, "fraction of holds cancelled; the rest are abandoned and expire")
	f.Duration("duration", 5*time.Minute, "cap on the load: stop after this long (0 means 10m)")
	cliconf.Alias(f, "max-duration", "duration")
	f.Uint64("seed", 1, "random seed")
	f.String("user-prefix", "", "prefix of buyer ids; default <sale>-s<seed>- (the same seed replays the same buyers)")
	f.String("http", "", "go through the storefront HTTP/JSON edges and their waiting rooms: each region's base URL,\n"+
		"as us=https://127.0.0.1:8401,eu=https://127.0.0.1:8402 (quotad dev's); every --skew region needs one; a region named\n"+
		"again adds another of its edges, its buyers spread over them (quotad dev --edges 2: us=https://127.0.0.1:8601,\n"+
		"us=https://127.0.0.1:8602, ...); empty: gRPC")
	f.Duration("waitlist", 0, "with --http: a buyer told SOLD_OUT joins the SKU's waitlist at its region and waits up to this\n"+
		"long for an offer (units released or expired), until the sale's page says sold out for good; 0: it leaves")
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
	Bound        int64            `json:"bound_elsewhere"`
	Overloaded   int64            `json:"overloaded"`
	Throttled    int64            `json:"throttled"`
	Admitted     int64            `json:"admitted,omitempty"`
	Polls        int64            `json:"polls,omitempty"`
	Waitlisted   int64            `json:"waitlisted,omitempty"`
	Offered      int64            `json:"offered,omitempty"`
	WaitedOut    int64            `json:"waited_out,omitempty"`
	Mode         string           `json:"mode"`
	Failed       int64            `json:"failed"`
	FirstError   string           `json:"first_error,omitempty"`
	Earlier      int64            `json:"replayed_from_earlier_run,omitempty"`
	Retries      int64            `json:"retries"`
	Confirmed    int64            `json:"confirmed"`
	Refunded     int64            `json:"refunded"`
	Released     int64            `json:"released"`
	Abandoned    int64            `json:"abandoned"`
	Carts        *int64           `json:"carts,omitempty"`
	CartsRefused *int64           `json:"carts_refused,omitempty"`
	// CartRefusals: the SKU of the line that refused a cart → reason → carts.
	CartRefusals map[string]map[string]int64 `json:"cart_refusals,omitempty"`
	Seconds      float64                     `json:"seconds"`
	PerSecond    float64                     `json:"reserves_per_second"`
}

func runLoad(e *env) error {
	names, weights, err := parsePairs("skew", []string{e.v.GetString("skew")})
	if err != nil {
		return err
	}
	edges, err := parseEdges(e.v.GetString("http"), e.v.GetBool("insecure"))
	if err != nil {
		return err
	}
	cart, err := loadCart(e.v.GetString("sku"), e.v.GetString("cart"), edges)
	if err != nil {
		return err
	}
	cfg := loadgen.Config{Sale: e.v.GetString("sale"), SKU: e.v.GetString("sku"), Buyers: e.v.GetInt("buyers"),
		Concurrency: e.v.GetInt("concurrency"), ConfirmRatio: e.v.GetFloat64("confirm"), ReleaseRatio: e.v.GetFloat64("release"),
		MaxDuration: e.v.GetDuration("duration"), Seed: e.v.GetUint64("seed"), UserPrefix: e.v.GetString("user-prefix"), Cart: cart}
	var invalid *loadgen.InvalidError
	if err := cfg.CheckSettings(); errors.As(err, &invalid) { // loadgen names its settings as their flags
		return usage("--%s %s: %s", invalid.Field, invalid.Value, invalid.Want)
	} else if err != nil {
		return usage("%v", err)
	}
	if cfg.UserPrefix == "" {
		cfg.UserPrefix = fmt.Sprintf("%s-s%d-", cfg.Sale, cfg.Seed)
	}
	if err := loadTargets(e, &cfg, names, weights, edges); err != nil {
		return err
	}
	cfg.Progress = func(s loadgen.Stats) {
		fmt.Fprintf(os.Stderr, "  %5.1fs  buyers %6d  granted %6d  exhausted %6d  limited %d  confirmed %6d  refunded %d  failed %d  units %s%s\n",
			s.Elapsed.Seconds(), s.Buyers, s.Granted, s.Exhausted, s.Limited, s.Confirmed, s.Refunded, s.Failed, perRegion(s.PerRegion),
			edgeProgress(cfg, s)+cartProgress(cfg, s))
	}
	s, err := loadgen.Run(e.cmd.Context(), cfg)
	if errors.Is(err, loadgen.ErrEdgeUnreachable) {
		return err
	} else if err != nil {
		return usage("%v", err)
	}
	out := loadJSON{Buyers: s.Buyers, Granted: s.Granted, UnitsGranted: s.UnitsGranted, PerRegion: s.PerRegion, Exhausted: s.Exhausted,
		SoldOut: s.SoldOut, Limited: s.Limited, Failed: s.Failed, Retries: s.Retries, Confirmed: s.Confirmed, Refunded: s.Refunded,
		Released: s.Released, Abandoned: s.Abandoned, Seconds: s.Elapsed.Seconds(), PerSecond: float64(s.Buyers) / s.Elapsed.Seconds(),
		FirstError: s.FirstError, Earlier: s.Earlier, Paused: s.Paused, Bound: s.Bound, Overloaded: s.Overloaded,
		Throttled: s.Throttled, Admitted: s.Admitted, Polls: s.Polls, Waitlisted: s.Waitlisted, Offered: s.Offered,
		WaitedOut: s.WaitedOut, Mode: "grpc"}
	if cfg.HTTP != nil {
		out.Mode = "http"
	}
	if len(cfg.Cart) > 0 {
		out.Carts, out.CartsRefused, out.CartRefusals = &s.Carts, &s.CartsRefused, s.CartRefusals
	}
	err = e.print(out, func(w io.Writer) { printLoadText(w, out, s.Elapsed) })
	if err == nil && out.Failed > 0 && out.Granted+out.Exhausted+out.SoldOut+out.Limited+out.Paused+out.Earlier+out.Bound+out.Overloaded+out.WaitedOut == 0 {
		return fmt.Errorf("every reserve failed; the first: %s", out.FirstError)
	}
	return err
}

// loadCart reads --cart: a cart's lines as SKU=quantity pairs, in place of --sku, over gRPC;
// nil without --cart, when --sku is required.
func loadCart(sku, cart string, edges map[string][]string) ([]loadgen.CartLine, error) {
	switch {
	case cart == "" && sku == "":
		return nil, usage("--sku: required, unless --cart (see quotactl load --help)")
	case cart == "":
		return nil, nil
	case sku != "":
		return nil, usage("--cart %s: a cart's lines come in place of --sku (%s): give one or the other", cart, sku)
	case len(edges) > 0:
		return nil, usage("--cart: carts are reserved over gRPC, not through the HTTP edges of --http")
	}
	names, nums, err := parsePairs("cart", []string{cart})
	if err != nil {
		return nil, err
	}
	lines := make([]loadgen.CartLine, len(names))
	for i, n := range names {
		lines[i] = loadgen.CartLine{SKU: n, Quantity: transfer.Units(nums[i])}
	}
	return lines, nil
}

// cartProgress is the progress line's cart-mode part: the carts granted and refused.
func cartProgress(cfg loadgen.Config, s loadgen.Stats) string {
	if len(cfg.Cart) == 0 {
		return ""
	}
	return fmt.Sprintf("  carts %6d  refused %d", s.Carts, s.CartsRefused)
}

// edgeProgress is the progress line's HTTP-mode part: the waiting room's counts.
func edgeProgress(cfg loadgen.Config, s loadgen.Stats) string {
	if cfg.HTTP == nil {
		return ""
	}
	p := fmt.Sprintf("  admitted %6d  sold out %d  bound elsewhere %d  throttled %d", s.Admitted, s.SoldOut, s.Bound, s.Throttled)
	if cfg.HTTP.Waitlist > 0 {
		p += fmt.Sprintf("  waitlisted %d  offered %d", s.Waitlisted, s.Offered)
	}
	return p
}

// loadTargets fills in where the buyers go: each --skew region's gRPC address (from the
// coordinator, which also resolves a region after a failover) and, with --http, its edge's
// URLs and an HTTP client presenting the storefront certificate.
func loadTargets(e *env, cfg *loadgen.Config, names []string, weights []int64, edges map[string][]string) error {
	var err error
	wait := e.v.GetDuration("waitlist")
	switch {
	case wait < 0:
		return usage("--waitlist %s: must not be negative", wait)
	case wait > 0 && len(edges) == 0:
		return usage("--waitlist: only with --http (the waitlist is the storefront edge's)")
	}
	if len(edges) > 0 {
		cfg.HTTP = &loadgen.HTTPEdge{Bases: map[string]string{}, More: map[string][]string{}, Waitlist: wait}
		if cfg.HTTP.Client, err = e.httpClient(cfg.Concurrency); err != nil {
			return err
		}
	} else if cfg.Creds, err = e.creds(); err != nil {
		return err
	}
	rs, err := e.regions()
	if err != nil {
		return err
	}
	for _, n := range slices.Sorted(maps.Keys(edges)) {
		if _, err := findRegion(rs, "http", n); err != nil {
			return err
		}
	}
	for i, n := range names {
		r, err := findRegion(rs, "skew", n)
		if err != nil {
			return err
		}
		cfg.Regions = append(cfg.Regions, loadgen.Region{Name: n, Addr: r.GetAddress(), Weight: weights[i]})
		if cfg.HTTP != nil {
			if len(edges[n]) == 0 {
				return usage("--http: no URL for region %s, which --skew sends buyers to", n)
			}
			cfg.HTTP.Bases[n], cfg.HTTP.More[n] = edges[n][0], edges[n][1:]
		}
	}
	if cfg.HTTP != nil {
		return nil
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
	return nil
}

// parseEdges parses --http: region=URL pairs, commas between them (or spaces, as in
// QUOTA_HTTP), each URL https:// (http:// under --insecure) with a host and no query; a
// region named again adds another edge of it (its buyers are spread over them).
func parseEdges(flag string, insecure bool) (map[string][]string, error) {
	want := "https"
	if insecure {
		want = "http"
	}
	edges := map[string][]string{}
	for _, kv := range cliconf.SplitList(flag) {
		name, raw, ok := strings.Cut(kv, "=")
		if !ok || name == "" || raw == "" {
			return nil, usage("--http %q: want region=URL, as us=https://127.0.0.1:8401", kv)
		}
		if len(edges[name]) >= maxEdgesPerRegion {
			return nil, usage("--http: more than %d URLs for region %s", maxEdgesPerRegion, name)
		}
		u, err := url.Parse(raw)
		switch {
		case err != nil:
			return nil, usage("--http %s: %v", name, err)
		case u.Scheme != want:
			return nil, usage("--http %s=%s: want a %s:// URL (%s://host:port)%s", name, raw, want, want, schemeHint(insecure))
		case u.Host == "" || u.Hostname() == "":
			return nil, usage("--http %s=%s: no host", name, raw)
		case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
			return nil, usage("--http %s=%s: want a base URL, without user, query or fragment", name, raw)
		}
		base := strings.TrimRight(u.String(), "/")
		if slices.Contains(edges[name], base) {
			return nil, usage("--http: %s=%s given twice", name, base)
		}
		edges[name] = append(edges[name], base)
	}
	return edges, nil
}

// maxEdgesPerRegion bounds the URLs --http names for one region.
const maxEdgesPerRegion = 16

func schemeHint(insecure bool) string {
	if insecure {
		return "; under --insecure the edges serve plaintext"
	}
	return "; the edges serve TLS (http:// only with --insecure)"
}

// httpClient is the HTTP client of --http: TLS 1.3 with the role's certificate (the
// storefront's unless --role says otherwise) and ca.crt from --certs-dir, HTTP/2; or
// plaintext HTTP/2 (h2c) under --insecure. Enough idle connections for concurrency callers.
func (e *env) httpClient(concurrency int) (*http.Client, error) {
	tr := &http.Transport{Protocols: new(http.Protocols), MaxIdleConnsPerHost: min(concurrency, 256),
		IdleConnTimeout: time.Minute, TLSHandshakeTimeout: 10 * time.Second}
	if e.v.GetBool("insecure") {
		tr.Protocols.SetUnencryptedHTTP2(true)
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
	}
	m, err := trust.Load(e.v.GetString("certs-dir"))
	if err != nil {
		return nil, usage("--certs-dir: %v (or --insecure for a plaintext cluster)", err)
	}
	role := roleOf(e.cmd)
	if r := e.v.GetString("role"); r != "" {
		if role, err = trust.ParseRole(r); err != nil {
			return nil, usage("--%v", err)
		}
	}
	if tr.TLSClientConfig, err = m.ClientConfig(role); err != nil {
		return nil, usage("--certs-dir: %v", err)
	}
	tr.Protocols.SetHTTP1(true)
	tr.Protocols.SetHTTP2(true)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
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

// printCartText is a cart-mode load's carts as text: granted, and refused by the SKU of the
// line that refused them and why ("case: 40 SOLD_OUT").
func printCartText(w io.Writer, out loadJSON) {
	fmt.Fprintf(w, "carts: %d granted (%d holds, one per line), %d refused whole", *out.Carts, out.Granted, *out.CartsRefused)
	var parts []string
	for _, sku := range slices.Sorted(maps.Keys(out.CartRefusals)) {
		for _, reason := range slices.Sorted(maps.Keys(out.CartRefusals[sku])) {
			parts = append(parts, fmt.Sprintf("%s: %d %s", sku, out.CartRefusals[sku][reason], reason))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, " (by the line refused: %s)", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
}

// printLoadText is a load's totals as text.
func printLoadText(w io.Writer, out loadJSON, elapsed time.Duration) {
	fmt.Fprintf(w, "%d buyers in %s (%.0f reserves/s): %d granted (%d units: %s), %d told region exhausted, %d sold out, %d over limit, %d failed\n",
		out.Buyers, elapsed.Round(time.Millisecond), out.PerSecond, out.Granted, out.UnitsGranted, perRegion(out.PerRegion), out.Exhausted, out.SoldOut, out.Limited, out.Failed)
	settled := "holds"
	if out.Carts != nil {
		settled = "carts"
		printCartText(w, out)
	}
	fmt.Fprintf(w, "%s: %d paid, %d refunded, %d cancelled, %d abandoned (expire after the hold ttl); %d retries\n",
		settled, out.Confirmed, out.Refunded, out.Released, out.Abandoned, out.Retries)
	if out.Mode == "http" {
		fmt.Fprintf(w, "waiting room: %d admitted with a ticket, %d polls, %d bound to another region (BOUND_ELSEWHERE), %d throttled (429, retried), %d gave up overloaded\n",
			out.Admitted, out.Polls, out.Bound, out.Throttled, out.Overloaded)
		if out.Waitlisted > 0 {
			fmt.Fprintf(w, "waitlist: %d told SOLD_OUT joined it, %d of them got a ticket, %d waited out\n", out.Waitlisted, out.Offered, out.WaitedOut)
		}
	} else if out.Bound+out.Throttled+out.Overloaded > 0 {
		fmt.Fprintf(w, "%d bound to another region (BOUND_ELSEWHERE), %d throttled (OVERLOADED, retried), %d gave up overloaded\n",
			out.Bound, out.Throttled, out.Overloaded)
	}
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
