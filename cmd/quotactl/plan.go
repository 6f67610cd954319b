package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

// planJSON is `quotactl rebalance --plan`'s answer: the automatic rebalancer's next step.
type planJSON struct {
	Sale     string        `json:"sale"`
	Mode     string        `json:"mode"`
	Enabled  bool          `json:"auto_rebalance"`
	At       time.Time     `json:"at"`
	Window   string        `json:"window"`
	Horizon  string        `json:"horizon"`
	MinUnits int64         `json:"min_units"`
	SKUs     []skuPlanJSON `json:"skus"`
}

type skuPlanJSON struct {
	SKU         string         `json:"sku"`
	NearSellOut bool           `json:"near_sell_out"`
	InFlight    int64          `json:"in_flight"`
	Pools       []poolPlanJSON `json:"pools"`
	Moves       []moveJSON     `json:"moves"`
	// Held says why none of the moves would start now; empty when they would.
	Held string `json:"held"`
}

type poolPlanJSON struct {
	Pool      string  `json:"pool"`
	Available int64   `json:"available"`
	Incoming  int64   `json:"incoming"`
	Recent    int64   `json:"recent"`
	PerSecond float64 `json:"per_second"`
	Need      int64   `json:"need"`
	// EmptyInMs is the projected time to empty; -1: never (no demand).
	EmptyInMs int64 `json:"empty_in_ms"`
	Frozen    bool  `json:"frozen"`
}

type moveJSON struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Units int64  `json:"units"`
}

func runRebalancePlan(e *env) error {
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	resp, err := c.PlanRebalance(e.ctx, &quotav1.PlanRebalanceRequest{SaleId: e.v.GetString("sale")})
	if err != nil {
		return fmt.Errorf("rebalance --plan: %w", err)
	}
	out := toPlanJSON(resp, e.v.GetString("sku"))
	if sku := e.v.GetString("sku"); sku != "" && len(out.SKUs) == 0 {
		return fmt.Errorf("rebalance --plan: sale %s has no sku %q", out.Sale, sku)
	}
	return e.print(out, func(w io.Writer) { printPlan(w, out) })
}

func toPlanJSON(resp *quotav1.PlanRebalanceResponse, only string) planJSON {
	out := planJSON{Sale: resp.GetSaleId(), Mode: resp.GetMode(), Enabled: resp.GetEnabled(), At: resp.GetAt().AsTime(),
		Window: (time.Duration(resp.GetWindowMs()) * time.Millisecond).String(), Horizon: (time.Duration(resp.GetHorizonMs()) * time.Millisecond).String(),
		MinUnits: resp.GetMinUnits(), SKUs: []skuPlanJSON{}}
	for _, k := range resp.GetSkus() {
		if only != "" && k.GetSku() != only {
			continue
		}
		sp := skuPlanJSON{SKU: k.GetSku(), NearSellOut: k.GetNearSellOut(), InFlight: k.GetInFlight(), Held: k.GetHeld(),
			Pools: []poolPlanJSON{}, Moves: []moveJSON{}}
		for _, p := range k.GetPools() {
			sp.Pools = append(sp.Pools, poolPlanJSON{Pool: p.GetPool(), Available: p.GetAvailable(), Incoming: p.GetIncoming(),
				Recent: p.GetRecent(), PerSecond: p.GetPerSecond(), Need: p.GetNeed(), EmptyInMs: p.GetEmptyInMs(), Frozen: p.GetFrozen()})
		}
		for _, m := range k.GetMoves() {
			sp.Moves = append(sp.Moves, moveJSON{m.GetFrom(), m.GetTo(), m.GetUnits()})
		}
		out.SKUs = append(out.SKUs, sp)
	}
	return out
}

func printPlan(w io.Writer, p planJSON) {
	on := "on"
	if !p.Enabled {
		on = "off on this coordinator"
	}
	fmt.Fprintf(w, "sale %s: rebalance %s (automatic rebalancing %s); demand over %s, stocked for %s, moves of at least %d\n",
		p.Sale, p.Mode, on, p.Window, p.Horizon, p.MinUnits)
	for _, k := range p.SKUs {
		var notes []string
		if k.InFlight > 0 {
			notes = append(notes, fmt.Sprintf("%d transfers in flight", k.InFlight))
		}
		if k.NearSellOut {
			notes = append(notes, "near sell-out")
		}
		fmt.Fprintf(w, "%s%s\n", k.SKU, parenthesized(notes))
		fmt.Fprintf(w, "  %-12s %10s %9s %9s %9s %9s %10s\n", "POOL", "AVAILABLE", "INCOMING", "RECENT", "RATE/S", "NEED", "EMPTY IN")
		for _, d := range k.Pools {
			empty := "never"
			if d.EmptyInMs >= 0 {
				empty = (time.Duration(d.EmptyInMs) * time.Millisecond).Round(100 * time.Millisecond).String()
			}
			frozen := ""
			if d.Frozen {
				frozen = "  frozen: a stranded transfer left it"
			}
			fmt.Fprintf(w, "  %-12s %10d %9d %9d %9.1f %9d %10s%s\n", d.Pool, d.Available, d.Incoming, d.Recent, d.PerSecond, d.Need, empty, frozen)
		}
		if len(k.Moves) == 0 {
			fmt.Fprintln(w, "  next: nothing to move")
		}
		for _, m := range k.Moves {
			fmt.Fprintf(w, "  next: %d %s → %s\n", m.Units, m.From, m.To)
		}
		if k.Held != "" {
			fmt.Fprintf(w, "  held: %s\n", k.Held)
		}
	}
}

// parenthesized is " (a, b)", or "" for no notes.
func parenthesized(notes []string) string {
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, ", ") + ")"
}
