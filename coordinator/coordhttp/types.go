package coordhttp

import (
	"time"

	"github.com/quotaworks/quota/transfer"
)

// saleView is GET api/sales/{sale}: what the sale page shows, refreshed every viewTTL.
type saleView struct {
	Sale            string         `json:"sale"`
	CreatedAt       time.Time      `json:"created_at"`
	OpensAt         time.Time      `json:"opens_at"`
	PerUserLimit    int64          `json:"per_user_limit"`
	At              time.Time      `json:"at"`
	DemandWindowSec float64        `json:"demand_window_sec"`
	Regions         []string       `json:"regions"`
	Pauses          []pauseJSON    `json:"pauses"`
	SKUs            []skuView      `json:"skus"`
	Transfers       []transferJSON `json:"transfers"`
	Plans           []planJSON     `json:"plans"`
	Audit           *auditJSON     `json:"audit"`
	// Errors name the regions that could not be read; their pools are left out.
	Errors []string `json:"errors"`
}

type pauseJSON struct {
	SKU       string    `json:"sku"`
	Reason    string    `json:"reason"`
	ChangedAt time.Time `json:"changed_at"`
}

type skuView struct {
	SKU         string     `json:"sku"`
	Total       int64      `json:"total"`
	Unallocated int64      `json:"unallocated"`
	SoldOut     bool       `json:"sold_out"`
	Paused      bool       `json:"paused"`
	Pools       []poolView `json:"pools"`
}

// poolView is one region's pool of a SKU: its units by state, as its database has them,
// the units reserved per second over the demand window, and at that rate the seconds until
// it is empty (absent when nobody reserves).
type poolView struct {
	Region       string   `json:"region"`
	Available    int64    `json:"available"`
	Held         int64    `json:"held"`
	Sold         int64    `json:"sold"`
	DemandPerSec float64  `json:"demand_per_sec"`
	EmptyInSec   *float64 `json:"empty_in_sec"`
	Exhausted    bool     `json:"exhausted"`
}

type transferJSON struct {
	ID        string    `json:"id"`
	SKU       string    `json:"sku"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Units     int64     `json:"units"`
	State     string    `json:"state"`
	Stranded  bool      `json:"stranded"`
	Settled   bool      `json:"settled"`
	Reason    string    `json:"reason"`
	CreatedAt time.Time `json:"created_at"`
	AgeSec    float64   `json:"age_sec"`
	// Open: requested or pending, so resolve may finish it.
	Open bool `json:"open"`
}

func toTransferJSON(t transfer.Transfer, now time.Time) transferJSON {
	return transferJSON{ID: t.ID, SKU: t.SKU, From: t.From, To: t.To, Units: int64(t.Units), State: string(t.State),
		Stranded: t.Stranded, Settled: t.Settled, Reason: t.Reason, CreatedAt: t.CreatedAt,
		AgeSec: now.Sub(t.CreatedAt).Seconds(), Open: !t.State.Final()}
}

// planJSON is the automatic rebalancer's next step for one SKU (coordinator.SKUPlan).
type planJSON struct {
	SKU         string         `json:"sku"`
	Mode        string         `json:"mode"`
	Enabled     bool           `json:"auto_rebalance"`
	NearSellOut bool           `json:"near_sell_out"`
	InFlight    int            `json:"in_flight"`
	Held        string         `json:"held"`
	Pools       []planPoolJSON `json:"pools"`
	Moves       []moveJSON     `json:"moves"`
	Error       string         `json:"error,omitempty"`
}

type planPoolJSON struct {
	Pool       string   `json:"pool"`
	Available  int64    `json:"available"`
	Incoming   int64    `json:"incoming"`
	Recent     int64    `json:"recent"`
	Need       int64    `json:"need"`
	PerSecond  float64  `json:"per_second"`
	EmptyInSec *float64 `json:"empty_in_sec"` // null: no demand, never empty
	Frozen     bool     `json:"frozen"`
}

type moveJSON struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Units int64  `json:"units"`
}

// auditJSON is the sale's audit (Coordinator.Audit, at most auditTTL old) and the continuous
// audit's last round.
type auditJSON struct {
	Ran        bool            `json:"ran"`
	OK         bool            `json:"ok"`
	At         time.Time       `json:"at,omitzero"`
	Violations []violationJSON `json:"violations"`
	SKUs       []auditSKUJSON  `json:"skus"`
	Continuous continuousJS    `json:"continuous"`
	Error      string          `json:"error,omitempty"`
}

type violationJSON struct {
	Invariant string `json:"invariant"`
	SKU       string `json:"sku"`
	Region    string `json:"region"`
	Evidence  string `json:"evidence"`
}

type auditSKUJSON struct {
	SKU         string `json:"sku"`
	Total       int64  `json:"total"`
	Unallocated int64  `json:"unallocated"`
	Available   int64  `json:"available"`
	Held        int64  `json:"held"`
	Sold        int64  `json:"sold"`
	InFlight    int64  `json:"in_flight"`
	Stranded    int64  `json:"stranded"`
	OK          bool   `json:"ok"`
}
