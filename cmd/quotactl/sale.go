package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func saleCmd() *cobra.Command {
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a sale and (with --allocate) split its stock over regions",
		Example: `  quotactl sale create --sale launch --sku phone=10000 --sku case=500 --per-user-limit 2 --hold-ttl 2m \
    --allocate us=40,eu=35,ap=25`,
		Args: cobra.NoArgs,
		RunE: withEnv(runSaleCreate),
	}
	f := create.Flags()
	f.String("sale", "", "sale id (required)")
	f.StringArray("sku", nil, "a SKU and its total units as sku=units; repeat the flag per SKU (required)")
	f.Int64("per-user-limit", 2, "most units of each SKU one user may hold or buy, across every region: each buyer is bound to\n"+
		"one region per sale, at admission with --admit-rate, else at their first reservation")
	f.Duration("hold-ttl", 2*time.Minute, "how long a hold waits for payment")
	f.String("opens-at", "", "when reservations open (RFC3339); default now")
	f.Int64("admit-rate", 0, "the waiting room: buyers admitted per second at each region, each with a ticket for one\n"+
		"reservation and bound to that region for the sale (the per-user limit across regions); 0: no waiting room")
	f.Duration("ticket-ttl", 0, "how long an admission ticket lasts (10s..1h); default 2m with a waiting room")
	f.Int64("max-live-tickets", 0, "most tickets live at once at each region; default 30 s of --admit-rate")
	f.String("room-return-url", "", "where the regions' waiting-room page sends an admitted shopper, with the ticket\n"+
		"(https, or http on a loopback host; docs/storefront.md); empty: the page admits no one")
	f.String("rebalance", "auto", "auto: the coordinator's rebalancer moves the sale's stock toward the regions that will run out first; manual: only operators move it")
	f.String("allocate", "", "weights per region, as us=40,eu=35,ap=25 (largest remainder split); empty leaves stock unallocated")
	f.String("request-key", "", "the request key of the allocation, which makes it idempotent; default alloc-<sale>")
	cliconf.Alias(f, "request-id", "request-key")
	show := &cobra.Command{Use: "show", Short: "Show a sale's ledger counts", Args: cobra.NoArgs, RunE: withEnv(runSaleShow),
		Example: "  quotactl sale show --sale launch"}
	show.Flags().String("sale", "", "sale id (required)")
	return group("sale", "Create, inspect, pause and resume sales", create, show, salePauseCmd(), saleResumeCmd())
}

// parsePairs parses "a=1,b=2" (or repeated "a=1") into ordered pairs.
func parsePairs(flag string, items []string) ([]string, []int64, error) {
	var names []string
	var nums []int64
	seen := map[string]bool{}
	for _, item := range items {
		pairs := cliconf.SplitList(item) // commas as on the command line, spaces as in QUOTA_* lists
		if len(pairs) == 0 {
			return nil, nil, usage("--%s %q: want name=number", flag, item)
		}
		for _, kv := range pairs {
			name, num, ok := strings.Cut(kv, "=")
			n, err := strconv.ParseInt(num, 10, 64)
			if !ok || name == "" || err != nil {
				return nil, nil, usage("--%s %q: want name=number", flag, kv)
			}
			if seen[name] {
				return nil, nil, usage("--%s: %q given twice", flag, name)
			}
			seen[name] = true
			names, nums = append(names, name), append(nums, n)
		}
	}
	return names, nums, nil
}

type saleJSON struct {
	Sale         string    `json:"sale"`
	PerUserLimit int64     `json:"per_user_limit"`
	HoldTTL      string    `json:"hold_ttl"`
	OpensAt      time.Time `json:"opens_at"`
	// AdmitRate is the waiting room's buyers per second at each region; 0: none.
	AdmitRate      int64  `json:"admit_rate"`
	TicketTTL      string `json:"ticket_ttl,omitempty"`
	MaxLiveTickets int64  `json:"max_live_tickets,omitempty"`
	// RoomReturnURL is where the waiting-room page sends an admitted shopper.
	RoomReturnURL string `json:"room_return_url,omitempty"`
	// Rebalance is auto (the coordinator's rebalancer moves the stock) or manual.
	Rebalance string     `json:"rebalance"`
	SKUs      []skuJSON  `json:"skus"`
	Replayed  bool       `json:"replayed,omitempty"`
	Transfers []xferJSON `json:"transfers,omitempty"`
	// Pauses are the sale's pauses in force (and resumes not yet at every region).
	Pauses []pauseJSON `json:"pauses,omitempty"`
}

type skuJSON struct {
	SKU         string           `json:"sku"`
	Total       int64            `json:"total"`
	Unallocated int64            `json:"unallocated"`
	Allocated   map[string]int64 `json:"allocated"`
}

type xferJSON struct {
	ID         string `json:"transfer_id"`
	Sale       string `json:"sale"`
	SKU        string `json:"sku"`
	From       string `json:"from"`
	To         string `json:"to"`
	Units      int64  `json:"units"`
	State      string `json:"state"`
	Generation int64  `json:"generation"`
	Stranded   bool   `json:"stranded"`
	Reason     string `json:"reason"`
	Age        string `json:"age"`
	Replayed   bool   `json:"replayed,omitempty"`
}

func toSaleJSON(s *quotav1.Sale) saleJSON {
	out := saleJSON{Sale: s.GetSaleId(), PerUserLimit: s.GetPerUserLimit(),
		HoldTTL: (time.Duration(s.GetHoldTtlMs()) * time.Millisecond).String(), OpensAt: s.GetOpensAt().AsTime(),
		AdmitRate: s.GetAdmitRate(), MaxLiveTickets: s.GetMaxLiveTickets(), Rebalance: s.GetRebalance(),
		RoomReturnURL: s.GetRoomReturnUrl()}
	if s.GetAdmitRate() > 0 {
		out.TicketTTL = (time.Duration(s.GetTicketTtlMs()) * time.Millisecond).String()
	}
	for _, k := range s.GetSkus() {
		alloc := k.GetAllocated()
		if alloc == nil {
			alloc = map[string]int64{} // {} in JSON, as for an allocated SKU: no null for scripts to handle
		}
		out.SKUs = append(out.SKUs, skuJSON{SKU: k.GetSku(), Total: k.GetTotal(), Unallocated: k.GetUnallocated(), Allocated: alloc})
	}
	for _, p := range s.GetPauses() {
		out.Pauses = append(out.Pauses, toPauseJSON(p))
	}
	return out
}

func printSale(e *env, s saleJSON) error {
	return e.print(s, func(w io.Writer) {
		replayed := ""
		if s.Replayed {
			replayed = " (replayed)"
		}
		fmt.Fprintf(w, "sale %s: per-user limit %d, hold ttl %s, opens %s%s\n", s.Sale, s.PerUserLimit, s.HoldTTL, s.OpensAt.Format(time.RFC3339), replayed)
		fmt.Fprintf(w, "  rebalance: %s\n", s.Rebalance)
		if s.AdmitRate > 0 {
			fmt.Fprintf(w, "  waiting room: %d buyers/s per region, tickets last %s, at most %d live\n", s.AdmitRate, s.TicketTTL, s.MaxLiveTickets)
			if s.RoomReturnURL != "" {
				fmt.Fprintf(w, "  waiting-room page returns shoppers to %s\n", s.RoomReturnURL)
			}
		}
		for _, k := range s.SKUs {
			regions := make([]string, 0, len(k.Allocated))
			for r := range k.Allocated {
				regions = append(regions, r)
			}
			sort.Strings(regions)
			// Allocated is what the unallocated pool has sent each region, not what the region
			// has now (sales and transfers between regions change that: quotactl stock).
			fmt.Fprintf(w, "  %s: total %d, unallocated %d", k.SKU, k.Total, k.Unallocated)
			for i, r := range regions {
				sep := ", "
				if i == 0 {
					sep = "; sent from the unallocated pool: "
				}
				fmt.Fprintf(w, "%s%s %d", sep, r, k.Allocated[r])
			}
			fmt.Fprintln(w)
		}
		for _, t := range s.Transfers {
			fmt.Fprintf(w, "  transfer %s: %d %s %s → %s %s\n", t.ID, t.Units, t.SKU, t.From, t.To, t.State)
		}
		for _, p := range s.Pauses {
			printPause(w, "  ", p)
		}
	})
}

func runSaleCreate(e *env) error {
	req, err := createRequest(e)
	if err != nil {
		return err
	}
	// --allocate is checked before the sale exists: a typo must not leave a created sale
	// behind whose terms can no longer change.
	areq, err := allocateRequest(e, req.GetSaleId())
	if err != nil {
		return err
	}
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	resp, err := c.CreateSale(e.ctx, req)
	if err != nil {
		return fmt.Errorf("create sale: %w", err)
	}
	out := toSaleJSON(resp.GetSale())
	out.Replayed = resp.GetReplayed()
	if areq != nil {
		aresp, err := c.Allocate(e.ctx, areq)
		if err != nil {
			return allocateFailed(req.GetSaleId(), areq.GetRequestId(), out.Replayed, err)
		}
		if len(aresp.GetTransfers()) == 0 {
			fmt.Fprintf(e.cmd.ErrOrStderr(), "note: --allocate moved nothing: sale %s has no unallocated units\n", req.GetSaleId())
		}
		for _, t := range aresp.GetTransfers() {
			out.Transfers = append(out.Transfers, toXferJSON(t))
		}
		g, err := c.GetSale(e.ctx, &quotav1.GetSaleRequest{SaleId: req.GetSaleId()})
		if err != nil {
			return err
		}
		out.SKUs = toSaleJSON(g.GetSale()).SKUs
	}
	return printSale(e, out)
}

// allocateFailed says what state an allocation that failed left the sale in, and what to do:
// a sale this command created has all its stock unallocated, one that existed already has
// whatever earlier allocations made of it.
func allocateFailed(sale, requestID string, existed bool, err error) error {
	state := "exists already"
	if !existed {
		state = "was created with its stock unallocated"
	}
	switch {
	case status.Code(err) == codes.AlreadyExists:
		// Allocation request keys are one namespace across sales: the key may be another sale's.
		return fmt.Errorf("sale %q %s, but request key %q was used before (for this sale with other weights, or for another sale): %w "+
			"(an allocation happens once per request key; to allocate what is still unallocated, pass a new --request-key; "+
			"to move allocated units, use quotactl transfer or rebalance)", sale, state, requestID, err)
	case !existed:
		return fmt.Errorf("sale %q was created with its stock unallocated, but allocating failed: %w "+
			"(run the same command again with the same terms and a corrected --allocate)", sale, err)
	default:
		return fmt.Errorf("sale %q exists already; allocating its unallocated units failed: %w", sale, err)
	}
}

// allocateRequest builds the Allocate call of --allocate (nil without it), after checking
// every region name against the coordinator's list.
func allocateRequest(e *env, sale string) (*quotav1.AllocateRequest, error) {
	alloc := e.v.GetString("allocate")
	if alloc == "" {
		if id := e.v.GetString("request-key"); id != "" {
			return nil, usage("--request-key %q names an allocation, and without --allocate there is none", id)
		}
		return nil, nil
	}
	names, weights, err := parsePairs("allocate", []string{alloc})
	if err != nil {
		return nil, err
	}
	rs, err := e.regions()
	if err != nil {
		return nil, err
	}
	areq := &quotav1.AllocateRequest{SaleId: sale, RequestId: e.v.GetString("request-key")}
	if areq.RequestId == "" {
		areq.RequestId = "alloc-" + sale
	}
	if why := transfer.CheckID(areq.RequestId); why != "" {
		return nil, usage("--request-key %q (the allocation's; default alloc-<sale>): %s", areq.RequestId, why)
	}
	for i, n := range names {
		if _, err := findRegion(rs, "allocate", n); err != nil {
			return nil, err
		}
		if weights[i] < 0 || weights[i] > 1_000_000 {
			return nil, usage("--allocate %s=%d: a weight must be 0..1000000", n, weights[i])
		}
		areq.Weights = append(areq.Weights, &quotav1.RegionWeight{Region: n, Weight: weights[i]})
	}
	if slices.Max(weights) == 0 {
		return nil, usage("--allocate: the weights sum to zero")
	}
	return areq, nil
}

func toXferJSON(t *quotav1.TransferInfo) xferJSON {
	return xferJSON{ID: t.GetTransferId(), Sale: t.GetSaleId(), SKU: t.GetSku(), From: t.GetFrom(), To: t.GetTo(), Units: t.GetUnits(),
		State: t.GetState(), Generation: t.GetGeneration(), Stranded: t.GetStranded(), Reason: t.GetReason(),
		Age: time.Since(t.GetCreatedAt().AsTime()).Round(time.Second).String()}
}

func createRequest(e *env) (*quotav1.CreateSaleRequest, error) {
	req := &quotav1.CreateSaleRequest{SaleId: e.v.GetString("sale"), PerUserLimit: e.v.GetInt64("per-user-limit"),
		HoldTtlMs: e.v.GetDuration("hold-ttl").Milliseconds(), AdmitRate: e.v.GetInt64("admit-rate"),
		TicketTtlMs: e.v.GetDuration("ticket-ttl").Milliseconds(), MaxLiveTickets: e.v.GetInt64("max-live-tickets"),
		Rebalance: e.v.GetString("rebalance"), RoomReturnUrl: e.v.GetString("room-return-url")}
	skus, err := e.cmd.Flags().GetStringArray("sku") // --sale and --sku are required: checkRequired
	if err != nil {
		return nil, err
	}
	names, totals, err := parsePairs("sku", skus)
	if err != nil {
		return nil, err
	}
	for i, n := range names {
		if totals[i] < 1 || transfer.Units(totals[i]) > transfer.MaxUnits {
			return nil, usage("--sku %s=%d: the total must be 1..%d", n, totals[i], transfer.MaxUnits)
		}
		req.Skus = append(req.Skus, &quotav1.SkuTotal{Sku: n, Total: totals[i]})
	}
	if at := e.v.GetString("opens-at"); at != "" {
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			return nil, usage("--opens-at %q: want RFC3339, like 2026-12-01T09:00:00Z", at)
		}
		req.OpensAt = timestamppb.New(t)
	}
	return req, nil
}

func runSaleShow(e *env) error {
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	resp, err := c.GetSale(e.ctx, &quotav1.GetSaleRequest{SaleId: e.v.GetString("sale")})
	if err != nil {
		return fmt.Errorf("get sale: %w", err)
	}
	return printSale(e, toSaleJSON(resp.GetSale()))
}
