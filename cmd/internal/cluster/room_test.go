package cluster_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region/regionhttp"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The waiting-room page's acceptance: shoppers in a real headless Chromium (as the console's
// test, console_test.go) against a real cluster over real TLS, a loopback store as the
// sale's return URL, and axe-core (testdata/axe, vendored) as the accessibility check.

// axeSHA256 is the digest of testdata/axe/axe.min.js (axe-core 4.14.1; testdata/axe/README.md).
const axeSHA256 = "29348999450cdf2849a8e70b7912fc2da85a849da39c0d0d5394f51d4a9ed95c"

// createRoomSale creates a sale with a waiting room opening at opensAt, one phone SKU of 10
// units all at us, admitting 1 buyer a second with at most one live ticket (so each next
// shopper is admitted only once the one before has reserved), and the page's return URL.
func createRoomSale(t *testing.T, d *cluster.Dev, sale, back string, opensAt time.Time) {
	t.Helper()
	ctx := context.Background()
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	if _, err := coord.CreateSale(ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 10}},
		PerUserLimit: 2, HoldTtlMs: 60000, AdmitRate: 1, TicketTtlMs: 30000, MaxLiveTickets: 1, OpensAt: timestamppb.New(opensAt),
		RoomReturnUrl: back}); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Allocate(ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale,
		Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
}

// roomLink is a signed entry link to the us region's page for user, lasting ttl.
func roomLink(t *testing.T, d *cluster.Dev, sale, user string, ttl time.Duration) string {
	t.Helper()
	data, err := os.ReadFile(d.TicketKeys)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := admission.ParseKeyring(data)
	if err != nil {
		t.Fatal(err)
	}
	q, err := keys.SignEntry(sale, user, time.Now().Add(ttl))
	if err != nil {
		t.Fatal(err)
	}
	return "https://" + d.Regions[0].RoomAddr() + "/room/" + sale + "?" + q.Encode()
}

// landing is one shopper's arrival at the store, and the reservation the store made with
// the ticket.
type landing struct {
	user, sale, region, hold string
	code                     int
	at, reserved             time.Time
}

// store is the sale's shop: a loopback HTTP server at the return URL that reserves a phone
// with each ticket it is brought, as a storefront's backend does (with its storefront
// certificate, at the region the ticket names).
type store struct {
	srv      *httptest.Server
	mu       sync.Mutex
	landings []landing
}

func startStore(t *testing.T, d *cluster.Dev) *store {
	t.Helper()
	s := &store{}
	c := httpClient(t, trust.Storefront)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/back" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		l := landing{sale: q.Get(regionhttp.ReturnSale), region: q.Get(regionhttp.ReturnRegion), at: time.Now()}
		a := call(t, c, "POST", edgeURL(d, l.region)+"/v1/sales/"+l.sale+"/reservations", map[string]any{
			"ticket": q.Get(regionhttp.ReturnTicket), "sku": "phone", "quantity": 1, "request_key": "order-" + l.at.Format("150405.000000")})
		l.code, l.user, l.hold, l.reserved = a.code, a.str("user_id"), a.str("hold_id"), time.Now()
		s.mu.Lock()
		s.landings = append(s.landings, l)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, "<!doctype html><html lang=en><title>Store</title><p id=held data-code=%d>%s</p></html>", l.code, l.hold)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *store) arrived() []landing {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]landing(nil), s.landings...)
}

// pageState is what a shopper's tab shows: its address and the page's place, if it is still
// the waiting room.
type pageState struct {
	Href      string `json:"href"`
	State     string `json:"state"`
	Position  string `json:"position"`
	Admission string `json:"admission"`
	Stored    string `json:"stored"`
}

const pageStateJS = `(() => { const p = document.getElementById('place'), m = document.getElementById('room');
  return {href: location.href, state: p ? p.dataset.state || '' : '', position: p ? p.dataset.position || '' : '',
    admission: m ? m.dataset.admission || '' : '', stored: sessionStorage.getItem('quota-room:drop') || ''}; })()`

// TestWaitingRoomPageInABrowser: three shoppers enter the waiting-room page before the sale
// opens and see their place; one reloads after their entry link expired and keeps it; at
// opening they are admitted one at a time and each lands on the store with a ticket that
// reserves; the page passes axe-core with no serious or critical violation.
func TestWaitingRoomPageInABrowser(t *testing.T) {
	browser := newBrowser(t)
	axe := readAxe(t)
	d := startDev(t, "us")
	st := startStore(t, d)
	opensAt := time.Now().Add(30 * time.Second) // room for three tabs and a reload on a loaded machine
	createRoomSale(t, d, "drop", st.srv.URL+"/back?from=room", opensAt)
	users := []string{"alice", "bob", "carol"}
	tabs := map[string]context.Context{}
	for _, u := range users {
		ttl := 10 * time.Minute
		if u == "carol" {
			ttl = 4 * time.Second // expired by the time she reloads
		}
		tabs[u] = tab(t, browser)
		link, err := json.Marshal(roomLink(t, d, "drop", u, ttl))
		if err != nil {
			t.Fatal(err)
		}
		goTo(t, tabs[u], u+" opens the waiting room", "location.assign("+string(link)+")",
			`!!document.querySelector('#place[data-state="waiting"]') && document.getElementById('status').innerText.includes('The sale opens in')`)
		s := eval[pageState](t, tabs[u], pageStateJS)
		if s.Admission == "" || !strings.Contains(s.Stored, s.Admission) || strings.Contains(s.Href, "sig=") {
			t.Fatalf("%s before opening: %+v; want an admission kept in sessionStorage and the link out of the address", u, s)
		}
	}
	checkAccessible(t, tabs["alice"], axe, "before opening")
	reloadKeepsThePlace(t, tabs["carol"], "carol")
	if time.Until(opensAt) < 2*time.Second {
		t.Fatalf("the sale opens at %s, too soon after the reload for the test to have seen the shoppers wait", opensAt)
	}
	seen := watchUntilLanded(t, st, tabs, users, opensAt.Add(60*time.Second))
	checkLandings(t, st.arrived(), seen, users, opensAt)
}

// goTo starts a navigation in the tab with the script nav, then waits until the expression
// done is true in the page, trying again the evaluations that fail while the tab is between
// two documents. (A reload by script, as a shopper's: chromedp's Reload waits for events of
// its own and lost the tab on this Chromium, "Not attached to an active page".)
func goTo(t *testing.T, ctx context.Context, what, nav, done string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	if _, err := tryEval[chromedp.Void](ctx, nav); err != nil {
		t.Fatalf("browser: %s: %v", what, err)
	}
	for {
		ok, err := tryEval[bool](ctx, done)
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			s, serr := tryEval[pageState](ctx, pageStateJS)
			text, terr := tryEval[string](ctx, `document.body ? document.body.innerText : ''`)
			t.Fatalf("browser: %s: not done after 60 s (%v); the page %+v (%v): %q (%v)", what, err, s, serr, text, terr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tryEval evaluates expr in the tab, for at most 10 s.
func tryEval[T any](ctx context.Context, expr string) (T, error) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(sctx, chromedp.Evaluate[T](expr))
}

// readAxe reads the vendored axe-core and checks it is the file its README names.
func readAxe(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "axe", "axe.min.js"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(src); hex.EncodeToString(sum[:]) != axeSHA256 {
		t.Fatalf("testdata/axe/axe.min.js has SHA-256 %x, want %s (testdata/axe/README.md)", sum, axeSHA256)
	}
	return string(src)
}

// axeViolation is one rule axe-core found broken on the page.
type axeViolation struct {
	ID     string   `json:"id"`
	Impact string   `json:"impact"`
	Help   string   `json:"help"`
	Nodes  []string `json:"nodes"`
}

// checkAccessible runs axe-core (WCAG 2.x A and AA rules and best practices) on the page in
// ctx and fails on any serious or critical violation, logging the others. The script is
// evaluated through the DevTools protocol, which the page's content security policy does
// not govern, so the page is checked as served.
func checkAccessible(t *testing.T, ctx context.Context, axe, when string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := chromedp.Run(sctx, chromedp.Evaluate[chromedp.Void](axe)); err != nil {
		t.Fatalf("load axe-core: %v", err)
	}
	vs, err := chromedp.Run(sctx, chromedp.Evaluate[[]axeViolation](`axe.run(document, {resultTypes: ['violations'],
		runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa', 'best-practice']}})
		.then(r => r.violations.map(v => ({id: v.id, impact: v.impact || '', help: v.help, nodes: v.nodes.map(n => n.html)})))`,
		chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("run axe-core: %v", err)
	}
	for _, v := range vs {
		if v.Impact == "serious" || v.Impact == "critical" {
			t.Errorf("axe-core %s: %s violation %s (%s) on %v", when, v.Impact, v.ID, v.Help, v.Nodes)
		} else {
			t.Logf("axe-core %s: %s violation %s (%s) on %v", when, v.Impact, v.ID, v.Help, v.Nodes)
		}
	}
	t.Logf("axe-core %s: %d violations, none serious or critical", when, len(vs))
}

// reloadKeepsThePlace reloads a shopper's page once their entry link has expired: the page
// must still show their place, with the same admission, from what the tab kept.
func reloadKeepsThePlace(t *testing.T, ctx context.Context, user string) {
	t.Helper()
	before := eval[pageState](t, ctx, pageStateJS)
	time.Sleep(time.Until(time.Now().Add(4500 * time.Millisecond).Truncate(time.Second))) // past the link's whole-second expiry
	if strings.Contains(before.Href, "?") {
		t.Fatalf("%s's address still has the link: %s", user, before.Href)
	}
	goTo(t, ctx, user+" reloads the page", "window.beforeReload = true; location.reload()",
		`!window.beforeReload && !!document.querySelector('#room[data-admission="`+before.Admission+`"] #place[data-state="waiting"]')`)
	after := eval[pageState](t, ctx, pageStateJS)
	if after.Admission != before.Admission {
		t.Fatalf("%s's admission was %s before the reload and %s after", user, before.Admission, after.Admission)
	}
}

// watchUntilLanded samples every tab until each shopper is on the store's page, and returns
// the positions each page showed on the way.
func watchUntilLanded(t *testing.T, st *store, tabs map[string]context.Context, users []string, deadline time.Time) map[string][]string {
	t.Helper()
	seen := map[string][]string{}
	landed := map[string]bool{}
	for len(landed) < len(users) {
		if time.Now().After(deadline) {
			t.Fatalf("by %s only %v landed on the store; positions seen %v; the store saw %+v", deadline, landed, seen, st.arrived())
		}
		for _, u := range users {
			if landed[u] {
				continue
			}
			s, err := tryEval[pageState](tabs[u], pageStateJS)
			if err != nil { // between the room and the store
				continue
			}
			if strings.HasPrefix(s.Href, st.srv.URL) {
				landed[u] = true
				continue
			}
			if s.State == "queued" && s.Position != "" {
				if p := seen[u]; len(p) == 0 || p[len(p)-1] != s.Position {
					seen[u] = append(seen[u], s.Position)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return seen
}

// checkLandings: each shopper landed once, after opening, one at a time (the next only after
// the one before had reserved: one live ticket), with the sale and region in the address and
// a ticket that reserved a phone for that shopper; the last to land had seen their number.
func checkLandings(t *testing.T, ls []landing, seen map[string][]string, users []string, opensAt time.Time) {
	t.Helper()
	if len(ls) != len(users) {
		t.Fatalf("the store saw %d landings, want %d: %+v", len(ls), len(users), ls)
	}
	who := map[string]bool{}
	for i, l := range ls {
		if l.code != http.StatusCreated || l.hold == "" || l.sale != "drop" || l.region != "us" {
			t.Errorf("landing %d: %+v; want the ticket to reserve (201) at us for sale drop", i, l)
		}
		if l.at.Before(opensAt) {
			t.Errorf("landing %d at %s, before the sale opened at %s", i, l.at, opensAt)
		}
		if i > 0 && l.at.Before(ls[i-1].reserved) {
			t.Errorf("%s landed at %s, before %s's reservation at %s: two tickets were live at once", l.user, l.at, ls[i-1].user, ls[i-1].reserved)
		}
		who[l.user] = true
		t.Logf("%s landed %s after opening, having seen positions %v", l.user, l.at.Sub(opensAt).Round(time.Millisecond), seen[l.user])
	}
	for _, u := range users {
		if !who[u] {
			t.Errorf("%s never reserved: landings %+v", u, ls)
		}
	}
	if last := ls[len(ls)-1].user; len(seen[last]) == 0 {
		t.Errorf("%s, admitted last, never saw their number in line (positions seen: %v)", last, seen)
	}
}

// TestWaitingRoomListenerIsPublic: the page's listener serves a browser with no client
// certificate, with the room's headers, and serves nothing of the storefront API; a bad or
// expired link is refused with its reason; an admission polled there carries return_to only
// once admitted.
func TestWaitingRoomListenerIsPublic(t *testing.T) {
	d := startDev(t, "us")
	opensAt := time.Now().Add(-time.Second)
	createRoomSale(t, d, "drop", "https://shop.example/back", opensAt)
	cfg, err := certs.ClientConfig(trust.Storefront)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates = nil // a browser's: it trusts the server, presents nothing
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	room := "https://" + d.Regions[0].RoomAddr()
	resp, err := c.Get(room + "/room/drop")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") != regionhttp.RoomCSP ||
		resp.Header.Get("Referrer-Policy") != "no-referrer" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("the page: %d %v", resp.StatusCode, resp.Header)
	}
	if a := call(t, c, "GET", room+"/v1/sales/drop", nil); a.code != 404 {
		t.Fatalf("the storefront API on the room's listener: %d %v", a.code, a.body)
	}
	link, err := url.Parse(roomLink(t, d, "drop", "dave", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	q := link.Query()
	enter := func(user string) answer {
		return enterRoom(t, c, room, "drop", map[string]string{"user": user, "exp": q.Get("exp"), "sig": q.Get("sig")})
	}
	if a := enter("mallory"); a.code != 401 || !strings.Contains(a.errField("message"), "bad signature") {
		t.Fatalf("another shopper's link: %d %v", a.code, a.body)
	}
	a := enter("dave")
	for a.code == http.StatusAccepted {
		time.Sleep(100 * time.Millisecond)
		a = call(t, c, "GET", room+"/room/drop/admissions/"+a.str("admission_id"), nil)
	}
	back, err := url.Parse(a.str("return_to"))
	if a.code != 200 || a.str("state") != "admitted" || err != nil || back.Host != "shop.example" || back.Query().Get("region") != "us" {
		t.Fatalf("dave admitted: %d %v", a.code, a.body)
	}
	sc := httpClient(t, trust.Storefront)
	res := call(t, sc, "POST", edgeURL(d, "us")+"/v1/sales/drop/reservations", map[string]any{"ticket": back.Query().Get("ticket"),
		"sku": "phone", "quantity": 1, "request_key": "dave-1"})
	if res.code != 201 || res.str("user_id") != "dave" {
		t.Fatalf("reserving with the page's ticket: %d %v", res.code, res.body)
	}
}
