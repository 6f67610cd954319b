package coordhttp_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/quotaworks/quota/transfer"
)

// fakeBackend is a coordinator with one sale "s" of one SKU over two regions, counting the
// changes asked of it.
type fakeBackend struct {
	resolves, rebalances atomic.Int64
	mu                   sync.Mutex
	actions              []transfer.Action
}

func (f *fakeBackend) RecordAction(_ context.Context, a transfer.Action) (transfer.Action, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a.Seq = int64(len(f.actions) + 1)
	f.actions = append(f.actions, a)
	return a, nil
}

// recorded is a copy of the actions recorded so far.
func (f *fakeBackend) recorded() []transfer.Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.actions)
}

func (f *fakeBackend) ListSales(context.Context, int) ([]coordinator.SaleSummary, error) {
	return []coordinator.SaleSummary{{Sale: "s", SKUs: 1, Total: 100}}, nil
}

func (f *fakeBackend) GetSale(_ context.Context, sale string) (coordinator.Sale, error) {
	if sale != "s" {
		return coordinator.Sale{}, apierr.NotFound("sale_id", sale)
	}
	return coordinator.Sale{Terms: coordinator.SaleTerms{Sale: "s", PerUserLimit: 1},
		SKUs: []coordinator.SKULedger{{SKU: "phone", Total: 100}}}, nil
}

func (f *fakeBackend) RecentTransfers(context.Context, string, int) ([]transfer.Transfer, error) {
	return []transfer.Transfer{{ID: "t1", Sale: "s", SKU: "phone", From: "us", To: "eu", Units: 5, State: transfer.Pending,
		Stranded: true, Reason: "credit at eu: unreachable", CreatedAt: time.Now().Add(-time.Minute)}}, nil
}

func (f *fakeBackend) Regions() []coordinator.RegionLink {
	books := func(name string, avail transfer.Units) coordinator.RegionLink {
		return coordinator.RegionLink{Name: name,
			Books: func(context.Context, string) (transfer.RegionBooks, error) {
				return transfer.RegionBooks{Region: name, Pools: []transfer.PoolBooks{{Sale: "s", SKU: "phone", Available: avail, Held: 2, Sold: 3}}}, nil
			},
			Demand: func(context.Context, string, time.Time) (map[string]transfer.Units, error) {
				return map[string]transfer.Units{"phone": 20}, nil
			}}
	}
	return []coordinator.RegionLink{books("us", 40), books("eu", 50)}
}

func (f *fakeBackend) Rebalance(_ context.Context, req coordinator.RebalanceRequest) (coordinator.RebalanceResult, error) {
	if !req.DryRun {
		f.rebalances.Add(1)
	}
	return coordinator.RebalanceResult{Pools: []transfer.PoolDemand{{Pool: "us", Available: 40}}}, nil
}

func (f *fakeBackend) PlanRebalance(_ context.Context, sale string) (coordinator.SalePlan, error) {
	return coordinator.SalePlan{Sale: sale, Mode: coordinator.RebalanceAuto, Enabled: true, SKUs: []coordinator.SKUPlan{{SKU: "phone",
		Pools: []coordinator.PoolPlan{{PoolDemand: transfer.PoolDemand{Pool: "us", Available: 40, Recent: 20}, Need: 60,
			Projection: transfer.Projection{PerSecond: 2, EmptyIn: 20 * time.Second}}},
		Moves: []transfer.Move{{From: "eu", To: "us", Units: 20}}, Held: "cooling down"}}}, nil
}

func (f *fakeBackend) Resolve(_ context.Context, id string, _ bool) (transfer.Transfer, error) {
	f.resolves.Add(1)
	return transfer.Transfer{ID: id, Sale: "s", State: transfer.Posted}, nil
}

func (f *fakeBackend) Audit(context.Context, string) (coordinator.Report, error) {
	return coordinator.Report{OK: true, At: time.Now()}, nil
}

func (f *fakeBackend) AuditHistory(_ context.Context, q coordinator.AuditHistoryQuery) ([]coordinator.AuditRound, int64, error) {
	if !q.RoundsOnly || q.Limit < 1 {
		return nil, 0, apierr.Invalid("limit", "the overview asks for a few rounds without their sales")
	}
	return []coordinator.AuditRound{{ID: 7, At: time.Now(), SKUs: 1, Violations: []coordinator.Violation{{Invariant: "I1", Sale: "s",
		SKU: "phone", Detail: "total 100 != 101"}}}, {ID: 6, At: time.Now().Add(-time.Second), OK: true, SKUs: 1}}, 0, nil
}

func (f *fakeBackend) AuditViolations() int64     { return 0 }
func (f *fakeBackend) AuditedAt() time.Time       { return time.Time{} }
func (f *fakeBackend) Generation() (int64, error) { return 1, nil }

type console struct {
	t    *testing.T
	h    *coordhttp.Console
	b    *fakeBackend
	keys *admission.Keyring
}

func newConsole(t *testing.T, insecure bool) *console {
	k, _ := newKeys(t)
	b := &fakeBackend{}
	return &console{t: t, b: b, keys: k, h: newHandler(t, b, coordhttp.Options{Insecure: insecure, Keys: func() *admission.Keyring { return k }})}
}

// newHandler is coordhttp.New, which must not fail.
func newHandler(t *testing.T, b coordhttp.Backend, opts coordhttp.Options) *coordhttp.Console {
	t.Helper()
	h, err := coordhttp.New(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// do sends one request as a browser on the console's own page would, with cookie and
// CSRF token when given, and extra headers.
func (c *console) do(method, path, body, cookie, csrf string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "https://console.test"+path, strings.NewReader(body))
	if method == http.MethodPost {
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Origin", "https://console.test")
		r.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	if cookie != "" {
		r.AddCookie(&http.Cookie{Name: coordhttp.CookieName, Value: cookie})
	}
	if csrf != "" {
		r.Header.Set(coordhttp.CSRFHeader, csrf)
	}
	for k, v := range hdr {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	c.h.ServeHTTP(w, r)
	return w
}

// login logs in with a token of role and returns the session cookie and CSRF token.
func (c *console) login(role trust.Role) (string, string) {
	c.t.Helper()
	tok := sign(c.t, c.keys, role, time.Now().Add(time.Hour))
	w := c.do("POST", "/console/api/login", `{"token":"`+tok+`"}`, "", "", nil)
	if w.Code != 200 {
		c.t.Fatalf("login %s: %d %s", role, w.Code, w.Body)
	}
	var s struct {
		CSRF string `json:"csrf"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &s); err != nil {
		c.t.Fatal(err)
	}
	for _, ck := range w.Result().Cookies() {
		if ck.Name == coordhttp.CookieName {
			return ck.Value, s.CSRF
		}
	}
	c.t.Fatal("login set no cookie")
	return "", ""
}

// TestActions pins who may do what on the console (docs/security.md prints it).
func TestActions(t *testing.T) {
	want := map[string][]trust.Role{
		coordhttp.ActionView:      {trust.Operator, trust.Auditor},
		coordhttp.ActionResolve:   {trust.Operator},
		coordhttp.ActionRebalance: {trust.Operator},
	}
	if !reflect.DeepEqual(coordhttp.Actions, want) {
		t.Fatalf("Actions = %v; a change here changes docs/security.md and this test", coordhttp.Actions)
	}
}

// TestRoleChecks: every route, for no session, an operator's and an auditor's, answers by
// the role table, and a refused change never reaches the coordinator.
func TestRoleChecks(t *testing.T) {
	c := newConsole(t, false)
	op, opCSRF := c.login(trust.Operator)
	au, auCSRF := c.login(trust.Auditor)
	type who struct{ cookie, csrf string }
	sessions := map[string]who{"none": {}, "operator": {op, opCSRF}, "auditor": {au, auCSRF}}
	routes := []struct {
		method, path, body string
		want               map[string]int
	}{
		{"GET", "/console/", "", map[string]int{"none": 200, "operator": 200, "auditor": 200}},
		{"GET", "/console/app.js", "", map[string]int{"none": 200, "operator": 200, "auditor": 200}},
		{"GET", "/console/api/session", "", map[string]int{"none": 401, "operator": 200, "auditor": 200}},
		{"GET", "/console/api/overview", "", map[string]int{"none": 401, "operator": 200, "auditor": 200}},
		{"GET", "/console/api/sales/s", "", map[string]int{"none": 401, "operator": 200, "auditor": 200}},
		{"GET", "/console/api/sales/nope", "", map[string]int{"none": 401, "operator": 404, "auditor": 404}},
		{"POST", "/console/api/transfers/t1/resolve", `{"refuse":false}`, map[string]int{"none": 401, "operator": 200, "auditor": 403}},
		{"POST", "/console/api/sales/s/rebalance", `{"sku":"phone","request_id":"r1"}`, map[string]int{"none": 401, "operator": 200, "auditor": 403}},
		{"GET", "/console/api/nothing", "", map[string]int{"none": 404, "operator": 404, "auditor": 404}},
	}
	for _, rt := range routes {
		for name, s := range sessions {
			w := c.do(rt.method, rt.path, rt.body, s.cookie, s.csrf, nil)
			if w.Code != rt.want[name] {
				t.Errorf("%s %s as %s: %d %s; want %d", rt.method, rt.path, name, w.Code, w.Body, rt.want[name])
			}
			if w.Header().Get("Content-Security-Policy") == "" || w.Header().Get("X-Frame-Options") != "DENY" {
				t.Errorf("%s %s: no security headers", rt.method, rt.path)
			}
		}
	}
	if n, m := c.b.resolves.Load(), c.b.rebalances.Load(); n != 1 || m != 1 {
		t.Fatalf("the coordinator was asked %d resolves and %d rebalances; want the operator's one each", n, m)
	}
	acts := c.b.recorded() // the operator's two changes, with the login; no refused one
	if len(acts) != 2 || acts[0].Action != "resolve transfer" || acts[0].Target != "t1" || acts[1].Action != "rebalance" ||
		acts[1].Target != "s/phone" {
		t.Fatalf("action log %+v; want the operator's resolve of t1 and rebalance of s/phone", acts)
	}
	for _, a := range acts {
		if a.Via != "console" || a.Role != string(trust.Operator) || a.Actor == "" || a.Result != "ok" {
			t.Fatalf("action %+v; want the console's operator login, ok", a)
		}
	}
	w := c.do("POST", "/console/api/transfers/t1/resolve", `{}`, au, auCSRF, nil)
	if code, body := apierr.HTTP(apierr.ErrPermissionDenied); w.Code != code || !strings.Contains(w.Body.String(), body.Error.Code) ||
		!strings.Contains(w.Body.String(), "role auditor") {
		t.Fatalf("auditor's resolve: %d %s; want 403 PERMISSION_DENIED naming the role", w.Code, w.Body)
	}
}

// TestChangesNeedSameOriginAndCSRF: an operator's change without its CSRF token, with
// another's, from another site, or as a form post is refused 403 and reaches nothing.
func TestChangesNeedSameOriginAndCSRF(t *testing.T) {
	c := newConsole(t, false)
	op, csrf := c.login(trust.Operator)
	_, otherCSRF := c.login(trust.Operator)
	const path, body = "/console/api/transfers/t1/resolve", `{"refuse":true}`
	cases := []struct {
		name, csrf string
		hdr        map[string]string
	}{
		{"no CSRF token", "", nil},
		{"another session's token", otherCSRF, nil},
		{"another origin", csrf, map[string]string{"Origin": "https://evil.test"}},
		{"cross-site fetch", csrf, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"a form post", csrf, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}},
		{"plain text", csrf, map[string]string{"Content-Type": "text/plain"}},
	}
	for _, tc := range cases {
		if w := c.do("POST", path, body, op, tc.csrf, tc.hdr); w.Code != 403 {
			t.Errorf("%s: %d %s; want 403", tc.name, w.Code, w.Body)
		}
	}
	if n := c.b.resolves.Load(); n != 0 {
		t.Fatalf("%d refused changes reached the coordinator", n)
	}
	if w := c.do("POST", "/console/api/login", `{"token":"x"}`, "", "", map[string]string{"Origin": "https://evil.test"}); w.Code != 403 {
		t.Fatalf("a login posted from another site: %d", w.Code)
	}
	if w := c.do("POST", path, `{"refuse":`+strings.Repeat(" ", coordhttp.MaxBody)+`true}`, op, csrf, nil); w.Code != 400 {
		t.Fatalf("a body over MaxBody: %d %s; want 400", w.Code, w.Body)
	}
	if w := c.do("POST", "/console/api/logout", `{}`, op, "", nil); w.Code != 403 {
		t.Fatalf("logout without the CSRF token: %d", w.Code)
	}
	if w := c.do("POST", "/console/api/logout", `{}`, op, csrf, nil); w.Code != 200 {
		t.Fatalf("logout: %d %s", w.Code, w.Body)
	}
	if w := c.do("GET", "/console/api/session", "", op, "", nil); w.Code != 401 {
		t.Fatalf("the session after logout: %d; want 401", w.Code)
	}
}

// TestLoginCookieAndRefusals: a login sets an HttpOnly, Secure, SameSite=Strict cookie
// scoped to the console; bad tokens are refused 401 with no cookie.
func TestLoginCookieAndRefusals(t *testing.T) {
	c := newConsole(t, false)
	tok := sign(t, c.keys, trust.Auditor, time.Now().Add(time.Hour))
	w := c.do("POST", "/console/api/login", `{"token":"`+tok+`"}`, "", "", nil)
	cks := w.Result().Cookies()
	if w.Code != 200 || len(cks) != 1 || !cks[0].HttpOnly || !cks[0].Secure || cks[0].SameSite != http.SameSiteStrictMode ||
		cks[0].Path != coordhttp.Prefix || len(cks[0].Value) < 40 {
		t.Fatalf("login: %d %v", w.Code, cks)
	}
	body, _ := io.ReadAll(w.Body)
	if !strings.Contains(string(body), `"can_change":false`) || !strings.Contains(string(body), `"role":"auditor"`) {
		t.Fatalf("an auditor's session: %s", body)
	}
	other, _ := newKeys(t)
	for name, bad := range map[string]string{
		"another key": sign(t, other, trust.Operator, time.Now().Add(time.Hour)),
		"expired":     sign(t, c.keys, trust.Operator, time.Now().Add(-time.Minute)),
		"garbage":     "hello",
	} {
		w := c.do("POST", "/console/api/login", `{"token":"`+bad+`"}`, "", "", nil)
		if w.Code != 401 || len(w.Result().Cookies()) != 0 {
			t.Errorf("login with %s: %d, cookies %v; want 401 and none", name, w.Code, w.Result().Cookies())
		}
	}
	if w := c.do("GET", "/console/api/session", "", "forged-session-id", "", nil); w.Code != 401 {
		t.Fatalf("a made-up session cookie: %d", w.Code)
	}
}

// TestInsecureHasNoLogin: under --insecure everyone is an operator without logging in, and
// the same-origin checks still hold.
func TestInsecureHasNoLogin(t *testing.T) {
	c := newConsole(t, true)
	w := c.do("GET", "/console/api/session", "", "", "", nil)
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"insecure":true`) || !strings.Contains(w.Body.String(), `"can_change":true`) {
		t.Fatalf("session under --insecure: %d %s", w.Code, w.Body)
	}
	if w := c.do("POST", "/console/api/transfers/t1/resolve", `{}`, "", "", nil); w.Code != 200 {
		t.Fatalf("resolve under --insecure: %d %s", w.Code, w.Body)
	}
	if w := c.do("POST", "/console/api/transfers/t1/resolve", `{}`, "", "", map[string]string{"Origin": "https://evil.test"}); w.Code != 403 {
		t.Fatalf("a cross-site resolve under --insecure: %d", w.Code)
	}
}

// TestSaleView: the view has each region's pool with its demand and time to empty, the
// stranded transfer with its reason, the plan and the audit.
func TestSaleView(t *testing.T) {
	c := newConsole(t, false)
	op, _ := c.login(trust.Operator)
	w := c.do("GET", "/console/api/sales/s", "", op, "", nil)
	var v struct {
		SKUs []struct {
			Pools []struct {
				Region                string
				Available, Held, Sold int64
				DemandPerSec          float64  `json:"demand_per_sec"`
				EmptyInSec            *float64 `json:"empty_in_sec"`
			}
		}
		Transfers []struct {
			ID, Reason string
			Stranded   bool
		}
		Plans []struct {
			SKU, Held string
			Pools     []struct {
				Need       int64
				EmptyInSec *float64 `json:"empty_in_sec"`
			}
			Moves []struct{ Units int64 }
		}
		Audit struct{ OK, Ran bool }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil || w.Code != 200 {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
	if len(v.SKUs) != 1 || len(v.SKUs[0].Pools) != 2 {
		t.Fatalf("view %s", w.Body)
	}
	us := v.SKUs[0].Pools[0]
	if us.Region != "us" || us.Available != 40 || us.Held != 2 || us.Sold != 3 || us.DemandPerSec != 2 || us.EmptyInSec == nil || *us.EmptyInSec != 20 {
		t.Fatalf("us pool %+v; want 40/2/3, 2/s, empty in 20 s", us)
	}
	if len(v.Transfers) != 1 || !v.Transfers[0].Stranded || v.Transfers[0].Reason == "" || len(v.Plans) != 1 || !v.Audit.Ran || !v.Audit.OK {
		t.Fatalf("view %s", w.Body)
	}
	if p := v.Plans[0]; p.SKU != "phone" || p.Held != "cooling down" || len(p.Moves) != 1 || p.Moves[0].Units != 20 ||
		len(p.Pools) != 1 || p.Pools[0].Need != 60 || p.Pools[0].EmptyInSec == nil || *p.Pools[0].EmptyInSec != 20 {
		t.Fatalf("plan %+v; want the automatic rebalancer's: 20 eu → us held back, us needing 60, empty in 20 s", p)
	}
}

// TestSessionEndsWithItsKey: a session lasts while its token's key is in the key file; a
// rotation keeps it (the previous key still verifies), a file without the key ends it.
func TestSessionEndsWithItsKey(t *testing.T) {
	k, data := newKeys(t)
	var cur atomic.Pointer[admission.Keyring]
	cur.Store(k)
	c := &console{t: t, b: &fakeBackend{}, keys: k}
	c.h = newHandler(t, c.b, coordhttp.Options{Keys: cur.Load})
	cookie, _ := c.login(trust.Operator)
	rotated, err := admission.RotateKeyFile(data, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := admission.ParseKeyring(rotated)
	if err != nil {
		t.Fatal(err)
	}
	cur.Store(k2)
	if n := c.h.KeysChanged(); n != 0 {
		t.Fatalf("a rotation ended %d sessions; the previous key still verifies", n)
	}
	if w := c.do("GET", "/console/api/session", "", cookie, "", nil); w.Code != 200 {
		t.Fatalf("the session after a rotation: %d; want 200", w.Code)
	}
	k3, _ := newKeys(t)
	cur.Store(k3)
	c.keys = k3
	c.login(trust.Auditor) // a login after the file changed ends the retired key's sessions, told or not
	if n := c.h.Sessions(); n[trust.Operator] != 0 || n[trust.Auditor] != 1 {
		t.Fatalf("sessions %v after a login of the new key; want the retired key's gone", n)
	}
	if w := c.do("GET", "/console/api/session", "", cookie, "", nil); w.Code != 401 {
		t.Fatalf("the session after its key left the file: %d; want 401", w.Code)
	}
	cur.Store(k)
	if w := c.do("GET", "/console/api/session", "", cookie, "", nil); w.Code != 401 {
		t.Fatalf("the session came back with its key: %d; want it ended for good", w.Code)
	}
}

// TestOverviewShowsTheLastAuditRounds: the overview lists the continuous audit's last stored
// rounds, newest first, each violation with its evidence.
func TestOverviewShowsTheLastAuditRounds(t *testing.T) {
	c := newConsole(t, true)
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, httptest.NewRequest("GET", "/console/api/overview", nil))
	var o struct {
		Rounds []struct {
			Round      int64 `json:"round_id"`
			OK         bool  `json:"ok"`
			Violations []struct {
				SKU      string `json:"sku"`
				Evidence string `json:"evidence"`
			} `json:"violations"`
		} `json:"rounds"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil || rec.Code != 200 {
		t.Fatalf("overview: %d %v\n%s", rec.Code, err, rec.Body)
	}
	if len(o.Rounds) != 2 || o.Rounds[0].Round != 7 || o.Rounds[0].OK || len(o.Rounds[0].Violations) != 1 ||
		o.Rounds[0].Violations[0].SKU != "s/phone" || o.Rounds[0].Violations[0].Evidence != "total 100 != 101" || !o.Rounds[1].OK {
		t.Fatalf("overview's rounds: %+v", o.Rounds)
	}
}
