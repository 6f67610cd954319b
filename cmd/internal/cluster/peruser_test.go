package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// perUserTries is how many reservations the buyer tries at each region at once.
const perUserTries = 20

// tally is what one buyer's tries got, from every region at once: the units granted per
// region and every answer's reason (with the region named by BOUND_ELSEWHERE).
type tally struct {
	mu      sync.Mutex
	granted map[string]int64
	answers map[string]int // "<region> <reason>[ -> <bound region>]"
}

func (ta *tally) add(region, reason string, units int64) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	ta.granted[region] += units
	ta.answers[region+" "+reason]++
}

func (ta *tally) String() string {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	var out []string
	for k, n := range ta.answers {
		out = append(out, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// grpcBoundRegion is the region a gRPC BOUND_ELSEWHERE names in its ErrorInfo.
func grpcBoundRegion(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()["region"]
		}
	}
	return ""
}

// TestPerUserLimitHoldsAcrossRegions: one buyer of a sale with a per-user limit of 2 tries
// all three regions at once, 20 reservations at each (over gRPC and the HTTP edge, mixed),
// in a sale without a waiting room and in one with: at most 2 units end up held across the
// regions, all at the one region the buyer is bound to in etcd, and every other region
// answers BOUND_ELSEWHERE naming it.
func TestPerUserLimitHoldsAcrossRegions(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	d := startDev(t, "us", "eu", "ap")
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	hc := httpClient(t, trust.Storefront)
	rc := map[string]quotav1.RegionServiceClient{}
	for _, n := range d.Regions {
		rc[n.R.Name()] = quotav1.NewRegionServiceClient(dial(t, n.Addr(), trust.Storefront))
	}

	lead := func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Coordinator.WaitLeading(ctx); err != nil { // its 2 s lease may lapse on a busy machine
			t.Fatal(err)
		}
	}
	t.Run("without a waiting room", func(t *testing.T) {
		lead(t)
		createSale(t, coord, "open", 300, 2, 10*time.Minute)
		ta := tryEverywhere(t, d, func(ctx context.Context, region string, i int) (string, int64) {
			return reserveOnce(ctx, rc[region], hc, edgeURL(d, region), "open", "alice", "", fmt.Sprintf("%s-%d", region, i), i%2 == 0)
		})
		checkOneRegion(t, d, "open", "alice", ta)
	})
	t.Run("with a waiting room", func(t *testing.T) {
		lead(t)
		createWaitingSale(t, d, "room", 300, 100, map[string]int64{"us": 40, "eu": 35, "ap": 25})
		wave := 0
		try := func(ctx context.Context, region string, i int) (string, int64) {
			ticket, reason := enterUntilAdmitted(ctx, rc[region], "room", "bob")
			if ticket == "" {
				return reason, 0
			}
			return reserveOnce(ctx, rc[region], hc, edgeURL(d, region), "room", "bob", ticket, fmt.Sprintf("%d-%s-%d", wave, region, i), i%2 == 0)
		}
		// A waiting room admits before the buyer's binding answers: each region may grant
		// bob up to the limit until then; every region but the one bound gives them back.
		ta := tryEverywhere(t, d, try)
		for region, n := range ta.granted {
			if n > 2 {
				t.Errorf("%s granted bob %d units, over the limit of 2 a region: %s", region, n, ta)
			}
		}
		bound := settledAtOneRegion(t, d, "room", "bob")
		wave++
		checkAnswers(t, tryEverywhere(t, d, try), "bob", bound)
	})
}

// settledAtOneRegion waits (20 s at most) until the buyer's held units are at the region
// etcd binds them to only, and returns it: 1..2 units there, none held at the others.
func settledAtOneRegion(t *testing.T, d *cluster.Dev, sale, user string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bound, ok, err := fencing.Bound(ctx, d.EtcdClient, sale, user)
	if err != nil || !ok {
		t.Fatalf("binding of %s in etcd: %q, %v, %v", user, bound, ok, err)
	}
	dbs := regionDBs(t, d, "us", "eu", "ap")
	for { // released ones aside: holds at the other regions are given back once their bindings answer
		held := map[string]int64{}
		for name, db := range dbs {
			var n int64
			qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := db.QueryRow(qctx, `SELECT coalesce(sum(quantity), 0) FROM holds WHERE sale_id = $1 AND user_id = $2 AND state <> 'released'`,
				sale, user).Scan(&n)
			qcancel()
			if err != nil {
				t.Fatal(err)
			}
			held[name] = n
		}
		if held[bound] >= 1 && held[bound] <= 2 && held["us"]+held["eu"]+held["ap"] == held[bound] {
			t.Logf("%s bound to %s, units held or sold by region: %v", user, bound, held)
			return bound
		}
		if ctx.Err() != nil {
			t.Fatalf("%s bound to %s, units held or sold by region: %v; want 1..2 there and none elsewhere", user, bound, held)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tryEverywhere runs try perUserTries times at each region, all at once, within a minute.
func tryEverywhere(t *testing.T, d *cluster.Dev, try func(ctx context.Context, region string, i int) (reason string, units int64)) *tally {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ta := &tally{granted: map[string]int64{}, answers: map[string]int{}}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, n := range d.Regions {
		region := n.R.Name()
		for i := range perUserTries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				reason, units := try(ctx, region, i)
				ta.add(region, reason, units)
			}()
		}
	}
	close(start)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the tries did not end within a minute: %s", ta)
	}
	t.Logf("answers: %s", ta)
	return ta
}

// reserveOnce reserves one unit with key over gRPC or (viaHTTP) the region's HTTP edge, and
// returns the answer's reason ("OK" for a hold, "BOUND_ELSEWHERE -> <region>" for a buyer bound
// elsewhere) and the units granted.
func reserveOnce(ctx context.Context, rc quotav1.RegionServiceClient, hc *http.Client, base, sale, user, ticket, key string, viaHTTP bool) (string, int64) {
	if !viaHTTP {
		res, err := rc.Reserve(ctx, &quotav1.ReserveRequest{SaleId: sale, Sku: "phone", UserId: user, Quantity: 1, RequestKey: key, Ticket: ticket})
		switch {
		case err == nil:
			return "OK", res.GetReservation().GetQuantity()
		case apierr.Reason(err) == "BOUND_ELSEWHERE":
			return "BOUND_ELSEWHERE -> " + grpcBoundRegion(err), 0
		}
		return apierr.Reason(err), 0
	}
	body := map[string]any{"sku": "phone", "quantity": 1, "request_key": key}
	if ticket == "" {
		body["user_id"] = user
	} else {
		body["ticket"] = ticket
	}
	code, got, err := postJSON(ctx, hc, base+"/v1/sales/"+sale+"/reservations", body)
	switch {
	case err != nil:
		return "HTTP error: " + err.Error(), 0
	case code == http.StatusCreated:
		q, _ := got["quantity"].(float64)
		return "OK", int64(q)
	}
	a := answer{code: code, body: got}
	if a.errCode() == "BOUND_ELSEWHERE" && code == http.StatusConflict {
		return "BOUND_ELSEWHERE -> " + a.errField("region"), 0
	}
	return fmt.Sprintf("%s (HTTP %d)", a.errCode(), code), 0
}

// postJSON posts body and decodes the JSON answer; safe to call from any goroutine.
func postJSON(ctx context.Context, c *http.Client, url string, body any) (int, map[string]any, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var got map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("answer %d is not JSON: %w", resp.StatusCode, err)
	}
	return resp.StatusCode, got, nil
}

// enterUntilAdmitted enters user in sale's waiting room over gRPC and polls until admitted
// (the ticket) or refused (the reason, with the region BOUND_ELSEWHERE names).
func enterUntilAdmitted(ctx context.Context, rc quotav1.RegionServiceClient, sale, user string) (ticket, reason string) {
	res, err := rc.Enter(ctx, &quotav1.EnterRequest{SaleId: sale, UserId: user})
	for apierr.Reason(err) == "OVERLOADED" { // the buyer's own token bucket (2 a second): enter again when told
		select {
		case <-ctx.Done():
			return "", "timed out entering"
		case <-time.After(apierr.RetryAfter(err)):
		}
		res, err = rc.Enter(ctx, &quotav1.EnterRequest{SaleId: sale, UserId: user})
	}
	for err == nil {
		a := res.GetAdmission()
		if a.GetState() == quotav1.AdmissionState_ADMISSION_STATE_ADMITTED {
			return a.GetTicket(), ""
		}
		if a.GetState() != quotav1.AdmissionState_ADMISSION_STATE_QUEUED {
			return "", "admission " + a.GetState().String()
		}
		select {
		case <-ctx.Done():
			return "", "timed out in line"
		case <-time.After(20 * time.Millisecond):
		}
		var g *quotav1.GetAdmissionResponse
		if g, err = rc.GetAdmission(ctx, &quotav1.GetAdmissionRequest{SaleId: sale, AdmissionId: a.GetAdmissionId()}); err == nil {
			res = &quotav1.EnterResponse{Admission: g.GetAdmission()}
		}
	}
	if apierr.Reason(err) == "BOUND_ELSEWHERE" {
		return "", "BOUND_ELSEWHERE -> " + grpcBoundRegion(err)
	}
	return "", "enter: " + apierr.Reason(err)
}

// checkOneRegion checks what the buyer's tries got against etcd and the regions' databases:
// one region bound, at most the limit (2) held there and at least one unit, none elsewhere,
// and every other region's answers BOUND_ELSEWHERE naming it.
func checkOneRegion(t *testing.T, d *cluster.Dev, sale, user string, ta *tally) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var total int64
	held := map[string]int64{}
	for name, db := range regionDBs(t, d, "us", "eu", "ap") {
		var n int64
		if err := db.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0) FROM holds WHERE sale_id = $1 AND user_id = $2`, sale, user).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != ta.granted[name] {
			t.Errorf("%s holds %d units of %s, but granted %d", name, n, user, ta.granted[name])
		}
		held[name] = n
		total += n
	}
	if total > 2 || total < 1 {
		t.Fatalf("%s holds %d units across the regions (%v); want 1..2, the per-user limit being 2: %s", user, total, held, ta)
	}
	bound, ok, err := fencing.Bound(ctx, d.EtcdClient, sale, user)
	if err != nil || !ok {
		t.Fatalf("binding of %s in etcd: %q, %v, %v", user, bound, ok, err)
	}
	if held[bound] != total {
		t.Errorf("%s holds %v, bound to %s: every unit should be there", user, held, bound)
	}
	checkAnswers(t, ta, user, bound)
}

// checkAnswers checks that every region but bound answered the buyer BOUND_ELSEWHERE naming
// it, and bound a hold or a refusal of its own.
func checkAnswers(t *testing.T, ta *tally, user, bound string) {
	t.Helper()
	ta.mu.Lock()
	defer ta.mu.Unlock()
	for k, n := range ta.answers {
		region, reason, _ := strings.Cut(k, " ")
		switch {
		case region != bound && reason != "BOUND_ELSEWHERE -> "+bound:
			t.Errorf("%s answered %s ×%d to a buyer bound to %s; want BOUND_ELSEWHERE naming it", region, reason, n, bound)
		case region == bound && !slices.ContainsFunc([]string{"OK", "LIMIT_EXCEEDED", "TICKET_USED", "admission ADMISSION_STATE_USED"},
			func(ok string) bool { return strings.HasPrefix(reason, ok) }):
			t.Errorf("%s, where %s is bound, answered %s ×%d; want a hold, LIMIT_EXCEEDED, TICKET_USED or a used admission", region, user, reason, n)
		}
	}
}
