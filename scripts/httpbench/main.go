//go:build ignore

// httpbench is the Go side of scripts/http-bench.sh (make http-bench): it prepares what wrk
// needs against a plaintext `quotad dev --insecure` and drives the gRPC comparison.
//
//	go run scripts/httpbench/main.go enter   -grpc ADDR -sale S -users N -prefix P -want tickets|admitted|queued -out FILE
//	go run scripts/httpbench/main.go reserve -grpc ADDR -sale S -sku K -tickets FILE -concurrency C -duration D [-max N]
//	go run scripts/httpbench/main.go loadgen -grpc ADDR -sale S -sku K -concurrency C -duration D -buyers N -prefix P
//
// enter puts N buyers in a sale's waiting room over gRPC and writes, one a line, their
// tickets once admitted (-want tickets), their admission ids once admitted (-want admitted)
// or their admission ids while still queued (-want queued). Each buyer gets a client address of its own (gRPC's Enter takes the address from
// the request), so the per-address limit does not pace the set-up.
//
// reserve is a closed loop of C callers on one gRPC connection, each taking the next unused
// ticket and reserving one unit with it and a request key of its own (RegionService.Reserve,
// durable before it answers), until D passes, the tickets run out or -max calls were made;
// with -confirm it pays for each hold too (to sell a SKU out).
//
// loadgen runs the project's load generator (loadgen) with C buyers in flight for D
// against a sale without a waiting room, reserves only (no confirm, no release).
//
// Each prints one line starting "HB " with key=value fields the shell script reads.
//
// The file carries the ignore build tag: it is a script, run with `go run` or built by the
// script, and stays out of ./... (the layout test puts every package of the tree in a layer).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/clock"
	"github.com/quotaworks/quota/loadgen"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: httpbench enter|reserve|loadgen [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "enter":
		err = runEnter(os.Args[2:])
	case "reserve":
		err = runReserve(os.Args[2:])
	case "loadgen":
		err = runLoadgen(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "httpbench: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "httpbench %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func dial(addr string) (*grpc.ClientConn, quotav1.RegionServiceClient, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return conn, quotav1.NewRegionServiceClient(conn), nil
}

// clientAddress is buyer i's own made-up address (in 10.0.0.0/8).
func clientAddress(i int) string {
	return fmt.Sprintf("10.%d.%d.%d", (i>>16)&0xff, (i>>8)&0xff, i&0xff)
}

func runEnter(args []string) error {
	fs := flag.NewFlagSet("enter", flag.ExitOnError)
	addr := fs.String("grpc", "", "the region's gRPC address")
	sale := fs.String("sale", "", "sale id")
	users := fs.Int("users", 1000, "buyers to enter (1..10,000,000)")
	prefix := fs.String("prefix", "hb-", "prefix of the buyer ids")
	want := fs.String("want", "tickets", "tickets (wait until admitted), admitted (their admission ids, once admitted) or queued (admission ids, not waiting)")
	out := fs.String("out", "", "file to write, one a line")
	conc := fs.Int("concurrency", 256, "calls in flight")
	window := fs.Int("window", 4096, "most buyers entered and not yet admitted")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole command")
	_ = fs.Parse(args)
	if *addr == "" || *sale == "" || *out == "" || *users < 1 || *users > 10_000_000 || *conc < 1 || *conc > 10_000 ||
		*window < 1 || (*want != "tickets" && *want != "admitted" && *want != "queued") {
		return errors.New("need -grpc, -sale, -out, -users 1..10000000, -concurrency 1..10000, -window >= 1, -want tickets|admitted|queued")
	}
	conn, rc, err := dial(*addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	e := &enterer{rc: rc, sale: *sale, want: *want, lines: make([]string, *users), entered: make(chan entered, *window+*conc),
		window: int64(*window), cancel: cancel}
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // stage 2: poll the entered buyers until admitted
		defer wg.Done()
		e.admit(ctx, *users, *conc)
	}()
	var next atomic.Int64
	for range *conc { // stage 1: enter them, at most -window ahead of the admitted
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= *users {
					return
				}
				for e.outstanding.Load() >= e.window && ctx.Err() == nil {
					_ = clock.Sleep(ctx, 5*time.Millisecond) // an ended ctx ends the loop
				}
				e.outstanding.Add(1)
				if err := e.enter(ctx, i, fmt.Sprintf("%s%d", *prefix, i), clientAddress(i)); err != nil {
					e.fail(fmt.Errorf("buyer %d: %w", i, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if e.firstErr != nil {
		return e.firstErr
	}
	if ctx.Err() != nil {
		return fmt.Errorf("timed out after %s with %d of %d buyers done", *timeout, e.done.Load(), *users)
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, l := range e.lines {
		fmt.Fprintln(w, l)
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		return err
	}
	el := time.Since(start)
	fmt.Printf("HB cmd=enter sale=%s want=%s users=%d seconds=%.2f per_sec=%.0f polls=%d overloaded=%d\n",
		*sale, *want, *users, el.Seconds(), float64(*users)/el.Seconds(), e.polls.Load(), e.overloaded.Load())
	return nil
}

// enterer enters buyers (stage 1) and polls them until admitted (stage 2). The room admits
// in the order of its line, so each polling pass goes through the waiting buyers in the
// order they entered and stops at the first chunk of them none of which is admitted yet:
// a poll is spent on about every admission, not on every waiting buyer every pass.
type enterer struct {
	rc                quotav1.RegionServiceClient
	sale, want        string
	lines             []string
	entered           chan entered
	window            int64
	outstanding, done atomic.Int64 // entered and not yet done; done
	polls, overloaded atomic.Int64
	mu                sync.Mutex
	firstErr          error
	cancel            context.CancelFunc
}

type entered struct {
	i  int
	id string
}

func (e *enterer) fail(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.firstErr == nil {
		e.firstErr = err
	}
	e.cancel()
}

// line is what an admission writes, or "" while the buyer still waits for it.
func (e *enterer) line(a *quotav1.Admission) (string, error) {
	switch s := a.GetState(); {
	case e.want == "queued":
		if s != quotav1.AdmissionState_ADMISSION_STATE_QUEUED {
			return "", fmt.Errorf("admission %s is %s, want queued", a.GetAdmissionId(), s)
		}
		return a.GetAdmissionId(), nil
	case a.GetTicket() != "" && e.want == "admitted":
		return a.GetAdmissionId(), nil
	case a.GetTicket() != "":
		return a.GetTicket(), nil
	case s != quotav1.AdmissionState_ADMISSION_STATE_QUEUED:
		return "", fmt.Errorf("admission %s is %s without a ticket", a.GetAdmissionId(), s)
	}
	return "", nil
}

func (e *enterer) finish(i int, line string) {
	e.lines[i] = line
	e.outstanding.Add(-1)
	e.done.Add(1)
}

func (e *enterer) enter(ctx context.Context, i int, user, addr string) error {
	var a *quotav1.Admission
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := e.rc.Enter(cctx, &quotav1.EnterRequest{SaleId: e.sale, UserId: user, ClientAddress: addr})
		cancel()
		if err == nil {
			a = resp.GetAdmission()
			break
		}
		if apierr.Reason(err) != "OVERLOADED" || attempt >= 50 {
			return err
		}
		e.overloaded.Add(1)
		if clock.Sleep(ctx, max(apierr.RetryAfter(err), 10*time.Millisecond)) != nil {
			return ctx.Err()
		}
	}
	l, err := e.line(a)
	if err != nil {
		return err
	}
	if l != "" {
		e.finish(i, l)
		return nil
	}
	select {
	case e.entered <- entered{i, a.GetAdmissionId()}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// admit polls the waiting buyers in passes, about every 20 ms, until all users are done.
func (e *enterer) admit(ctx context.Context, users, conc int) {
	chunk := min(conc, 256)
	var waiting []entered
	for e.done.Load() < int64(users) && ctx.Err() == nil {
		if len(waiting) == 0 {
			select {
			case x := <-e.entered:
				waiting = append(waiting, x)
			case <-time.After(10 * time.Millisecond):
				continue
			case <-ctx.Done():
				return
			}
		}
		for more := true; more; {
			select {
			case x := <-e.entered:
				waiting = append(waiting, x)
			default:
				more = false
			}
		}
		sort.Slice(waiting, func(a, b int) bool { return waiting[a].i < waiting[b].i })
		got := make([]string, len(waiting))
		for lo := 0; lo < len(waiting); lo += chunk {
			hi := min(lo+chunk, len(waiting))
			var wg sync.WaitGroup
			var admitted atomic.Int64
			for j := lo; j < hi; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					e.polls.Add(1)
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					resp, err := e.rc.GetAdmission(cctx, &quotav1.GetAdmissionRequest{SaleId: e.sale, AdmissionId: waiting[j].id})
					cancel()
					if err == nil {
						got[j], err = e.line(resp.GetAdmission())
					}
					if err != nil {
						e.fail(fmt.Errorf("buyer %d: %w", waiting[j].i, err))
					} else if got[j] != "" {
						admitted.Add(1)
					}
				}()
			}
			wg.Wait()
			if admitted.Load() == 0 {
				break // the rest of the line is further back still
			}
		}
		rest := waiting[:0]
		for j, x := range waiting {
			if got[j] != "" {
				e.finish(x.i, got[j])
			} else {
				rest = append(rest, x)
			}
		}
		waiting = rest
		_ = clock.Sleep(ctx, 20*time.Millisecond) // an ended ctx ends the loop
	}
}

// ready connects conn and waits until it is, so that the clock starts on connected callers,
// as wrk's connections are before its clock starts.
func ready(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			return ctx.Err()
		}
	}
	return nil
}

func readLines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}

func runReserve(args []string) error {
	fs := flag.NewFlagSet("reserve", flag.ExitOnError)
	addr := fs.String("grpc", "", "the region's gRPC address")
	sale := fs.String("sale", "", "sale id")
	sku := fs.String("sku", "", "SKU")
	tickets := fs.String("tickets", "", "file of tickets, one a line (each used once)")
	conc := fs.Int("concurrency", 64, "callers in flight")
	dur := fs.Duration("duration", 10*time.Second, "how long to run (at most 10m)")
	maxOps := fs.Int("max", 0, "stop after this many calls (0: as many as tickets)")
	keyPrefix := fs.String("key-prefix", "grpc-", "prefix of the request keys")
	nconns := fs.Int("conns", 1, "gRPC connections the callers share, round robin (1..64)")
	confirm := fs.Bool("confirm", false, "pay for every hold made (sells the units: for draining a SKU to sold out)")
	_ = fs.Parse(args)
	if *addr == "" || *sale == "" || *sku == "" || *tickets == "" || *conc < 1 || *conc > 10_000 || *dur <= 0 || *dur > 10*time.Minute ||
		*nconns < 1 || *nconns > 64 {
		return errors.New("need -grpc, -sale, -sku, -tickets, -concurrency 1..10000, -duration (0, 10m], -conns 1..64")
	}
	tks, err := readLines(*tickets)
	if err != nil {
		return err
	}
	users := make([]string, len(tks))
	for i, t := range tks {
		pt, err := admission.Peek(t)
		if err != nil {
			return fmt.Errorf("ticket %d: %w", i+1, err)
		}
		users[i] = pt.User
	}
	limit := len(tks)
	if *maxOps > 0 && *maxOps < limit {
		limit = *maxOps
	}
	clients := make([]quotav1.RegionServiceClient, *nconns)
	for i := range clients {
		conn, rc, err := dial(*addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		if err := ready(conn); err != nil {
			return fmt.Errorf("no connection to %s: %w", *addr, err)
		}
		clients[i] = rc
	}
	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()
	var next, created, replayed, calls, confirmed atomic.Int64
	var mu sync.Mutex
	reasons := map[string]int64{}
	firstErr := ""
	start := time.Now()
	var last atomic.Int64 // ns after start of the last completion
	var wg sync.WaitGroup
	for w := range *conc {
		rc := clients[w%len(clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= limit {
					return
				}
				// Each call has a deadline of its own, not the run's: a call in flight when the
				// clock ends finishes, uncounted (as wrk leaves its last requests), rather than
				// being cut off into an error.
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := rc.Reserve(cctx, &quotav1.ReserveRequest{SaleId: *sale, Sku: *sku, UserId: users[i], Quantity: 1,
					RequestKey: fmt.Sprintf("%s%d", *keyPrefix, i), Ticket: tks[i]})
				ccancel()
				if ctx.Err() != nil {
					return // finished after the clock: not counted
				}
				calls.Add(1)
				last.Store(int64(time.Since(start)))
				switch {
				case err == nil && resp.GetReplayed():
					replayed.Add(1)
				case err == nil:
					created.Add(1)
					if *confirm {
						h := resp.GetReservation().GetHoldId()
						fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
						c, err := rc.Confirm(fctx, &quotav1.ConfirmRequest{HoldId: h, PaymentId: "pay-" + h})
						fcancel()
						if err != nil || c.GetOutcome() != quotav1.ConfirmOutcome_CONFIRM_OUTCOME_SOLD {
							mu.Lock()
							reasons["CONFIRM_FAILED"]++
							mu.Unlock()
						} else {
							confirmed.Add(1)
						}
					}
				default:
					r := apierr.Reason(err)
					if r == "" {
						r = "OTHER"
					}
					mu.Lock()
					reasons[r]++
					if firstErr == "" {
						firstErr = err.Error()
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if d := time.Duration(last.Load()); next.Load() >= int64(limit) && d > 0 {
		el = d // ran out of tickets before the clock: the rate over the time it ran
	}
	var rs []string
	for r, n := range reasons {
		rs = append(rs, fmt.Sprintf("%s:%d", r, n))
	}
	sort.Strings(rs)
	fmt.Printf("HB cmd=reserve sale=%s concurrency=%d conns=%d calls=%d created=%d confirmed=%d replayed=%d refused=%s seconds=%.3f created_per_sec=%.0f calls_per_sec=%.0f exhausted_tickets=%t\n",
		*sale, *conc, *nconns, calls.Load(), created.Load(), confirmed.Load(), replayed.Load(), strings.Join(append(rs, ""), ","), el.Seconds(),
		float64(created.Load())/el.Seconds(), float64(calls.Load())/el.Seconds(), next.Load() >= int64(len(tks)))
	if firstErr != "" {
		fmt.Fprintf(os.Stderr, "httpbench reserve: first refusal: %s\n", firstErr)
	}
	return nil
}

func runLoadgen(args []string) error {
	fs := flag.NewFlagSet("loadgen", flag.ExitOnError)
	addr := fs.String("grpc", "", "the region's gRPC address")
	sale := fs.String("sale", "", "sale id (without a waiting room)")
	sku := fs.String("sku", "", "SKU")
	conc := fs.Int("concurrency", 64, "buyers in flight")
	dur := fs.Duration("duration", 10*time.Second, "how long to run (at most 10m)")
	buyers := fs.Int("buyers", 1_000_000, "bound on the buyers")
	prefix := fs.String("prefix", "lg-", "prefix of the buyer ids")
	_ = fs.Parse(args)
	if *addr == "" || *sale == "" || *sku == "" || *dur <= 0 || *dur > 10*time.Minute {
		return errors.New("need -grpc, -sale, -sku, -duration (0, 10m]")
	}
	s, err := loadgen.Run(context.Background(), loadgen.Config{Sale: *sale, SKU: *sku,
		Regions: []loadgen.Region{{Name: "us", Addr: *addr, Weight: 1}}, Creds: insecure.NewCredentials(),
		Buyers: *buyers, Concurrency: *conc, MaxDuration: *dur, UserPrefix: *prefix})
	if err != nil {
		return err
	}
	fmt.Printf("HB cmd=loadgen sale=%s concurrency=%d buyers=%d granted=%d exhausted=%d sold_out=%d failed=%d retries=%d seconds=%.3f created_per_sec=%.0f\n",
		*sale, *conc, s.Buyers, s.Granted, s.Exhausted, s.SoldOut, s.Failed, s.Retries, s.Elapsed.Seconds(),
		float64(s.Granted)/s.Elapsed.Seconds())
	if s.FirstError != "" {
		fmt.Fprintf(os.Stderr, "httpbench loadgen: first failure (buyers cut off by the clock fail too): %s\n", s.FirstError)
	}
	return nil
}
