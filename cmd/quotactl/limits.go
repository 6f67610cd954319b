package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
)

type offenderJSON struct {
	Sale       string           `json:"sale"`
	SKU        string           `json:"sku"`
	User       string           `json:"user"`
	Limit      int64            `json:"limit"`
	Units      int64            `json:"units"`
	ByRegion   map[string]int64 `json:"by_region"`
	Bound      string           `json:"bound,omitempty"`
	BoundError string           `json:"bound_error,omitempty"`
}

type limitsJSON struct {
	OK         bool           `json:"ok"`
	At         time.Time      `json:"at"`
	Sales      []string       `json:"sales"`
	Buyers     int64          `json:"buyers"`
	Over       int64          `json:"over"`
	Offenders  []offenderJSON `json:"offenders"`
	Unreadable []failureJSON  `json:"unreadable"`
}

type failureJSON struct {
	Region string `json:"region"`
	Error  string `json:"error"`
}

// runAuditLimits is quotactl audit --limits: exit 1 when a buyer is over the limit or a
// region's records could not be read.
func runAuditLimits(e *env) error {
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	resp, err := c.AuditLimits(e.ctx, &quotav1.AuditLimitsRequest{SaleId: e.v.GetString("sale")})
	if err != nil {
		return fmt.Errorf("audit limits: %w", err)
	}
	out := limitsJSON{OK: resp.GetOk(), At: resp.GetAt().AsTime(), Sales: append([]string{}, resp.GetSales()...), Buyers: resp.GetBuyers(),
		Over: resp.GetOver(), Offenders: []offenderJSON{}, Unreadable: toFailuresJSON(resp.GetUnreadable())}
	for _, o := range resp.GetOffenders() {
		out.Offenders = append(out.Offenders, offenderJSON{Sale: o.GetSaleId(), SKU: o.GetSku(), User: o.GetUserId(), Limit: o.GetLimit(),
			Units: o.GetUnits(), ByRegion: o.GetByRegion(), Bound: o.GetBound(), BoundError: o.GetBoundError()})
	}
	if err := e.print(out, func(w io.Writer) { printLimitsText(w, out) }); err != nil {
		return err
	}
	if !out.OK {
		return &exitError{code: 1}
	}
	return nil
}

func toFailuresJSON(fs []*quotav1.RegionFailure) []failureJSON {
	out := []failureJSON{}
	for _, f := range fs {
		out = append(out, failureJSON{f.GetRegion(), f.GetError()})
	}
	return out
}

func printLimitsText(w io.Writer, l limitsJSON) {
	for _, o := range l.Offenders {
		var parts []string
		for _, r := range slices.Sorted(maps.Keys(o.ByRegion)) {
			parts = append(parts, fmt.Sprintf("%s %d", r, o.ByRegion[r]))
		}
		bound := "bound to " + o.Bound
		switch {
		case o.BoundError != "":
			bound = "binding unread: " + o.BoundError
		case o.Bound == "":
			bound = "no binding"
		}
		fmt.Fprintf(w, "OVER LIMIT %s/%s buyer %s: %d units, limit %d (%s; %s)\n", o.Sale, o.SKU, o.User, o.Units, o.Limit,
			strings.Join(parts, ", "), bound)
	}
	if int64(len(l.Offenders)) < l.Over {
		fmt.Fprintf(w, "... and %d more\n", l.Over-int64(len(l.Offenders)))
	}
	for _, f := range l.Unreadable {
		fmt.Fprintf(w, "UNREADABLE %s: %s\n", f.Region, f.Error)
	}
	if l.OK {
		fmt.Fprintf(w, "limits ok: %d buyer(s) of %d sale(s) within the per-user limit\n", l.Buyers, len(l.Sales))
	} else {
		fmt.Fprintf(w, "limits FAILED: %d buyer(s) over the per-user limit, %d region(s) unread\n", l.Over, len(l.Unreadable))
	}
}
