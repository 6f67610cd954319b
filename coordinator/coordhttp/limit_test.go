package coordhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/trust"
)

// clock is a console's time, moved by the test.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// loginFrom posts a login of tok from the client address remote.
func loginFrom(h http.Handler, tok, remote string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "https://console.test/console/api/login", strings.NewReader(`{"token":"`+tok+`"}`))
	r.Header.Set("Content-Type", "application/json")
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestLoginRateLimits: a token's logins past its burst, an address's logins of a role past
// its burst and an address's refused logins past theirs are each refused 429 with
// Retry-After and a message naming the limit; each limit is its own, so none of them keeps
// an operator from logging in, and a bucket refills with time. The bucket tables are
// bounded, and a full one refuses only new keys of its own role.
func TestLoginRateLimits(t *testing.T) {
	k, _ := newKeys(t)
	clk := &clock{now: time.Now()}
	lim := coordhttp.LoginLimits{PerToken: coordhttp.Rate{Burst: 3, Every: 10 * time.Second},
		PerAddress: coordhttp.Rate{Burst: 5, Every: 10 * time.Second}, MaxKeys: 4}
	h := newHandler(t, &fakeBackend{}, coordhttp.Options{Keys: func() *admission.Keyring { return k }, Now: clk.Now, Limits: &lim})
	token := func(role trust.Role, name string) string {
		tok, err := coordhttp.SignToken(k, role, name, clk.now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	expect := func(what string, w *httptest.ResponseRecorder, code int, msg string) {
		t.Helper()
		if w.Code != code || !strings.Contains(w.Body.String(), msg) || (code == 429) != (w.Header().Get("Retry-After") == "10") {
			t.Fatalf("%s: %d %s Retry-After %q; want %d naming %q", what, w.Code, w.Body, w.Header().Get("Retry-After"), code, msg)
		}
	}
	alice := token(trust.Auditor, "alice")
	for i := range 3 {
		expect("alice's login "+string(rune('1'+i)), loginFrom(h, alice, "192.0.2.1:1"), 200, "auditor")
	}
	expect("alice's 4th login", loginFrom(h, alice, "192.0.2.2:1"), 429, "logins of the auditor token of alice (3 at once, then one every 10s)")
	expect("bob from alice's address", loginFrom(h, token(trust.Auditor, "bob"), "192.0.2.1:2"), 200, "bob")
	expect("carol from alice's address", loginFrom(h, token(trust.Auditor, "carol"), "192.0.2.1:3"), 200, "carol")
	expect("dave from alice's address", loginFrom(h, token(trust.Auditor, "dave"), "192.0.2.1:4"), 429, "auditor logins from address 192.0.2.1 (5 at once")
	expect("an operator from alice's address", loginFrom(h, token(trust.Operator, "olga"), "192.0.2.1:5"), 200, "operator")
	for range 5 {
		expect("a forged token", loginFrom(h, alice[:len(alice)-4]+"AAAA", "192.0.2.9:1"), 401, "UNAUTHENTICATED")
	}
	expect("a 6th forged token", loginFrom(h, "garbage", "192.0.2.9:1"), 429, "refused logins from address 192.0.2.9")
	expect("an operator from the forger's address", loginFrom(h, token(trust.Operator, "oscar"), "192.0.2.9:2"), 200, "oscar")
	clk.now = clk.now.Add(10 * time.Second)
	expect("alice 10 s later", loginFrom(h, alice, "192.0.2.3:1"), 200, "alice")

	// The auditors' address table holds 4 buckets: .1, .2 (refilled by now), .3; .4 makes
	// four, .6 takes the place of .2, and .5 finds it full of buckets that have not refilled
	// and is refused; an operator's login from .5 is not.
	expect("erin from a 4th address", loginFrom(h, token(trust.Auditor, "erin"), "192.0.2.4:1"), 200, "erin")
	expect("gina from a 5th address", loginFrom(h, token(trust.Auditor, "gina"), "192.0.2.6:1"), 200, "gina")
	if w := loginFrom(h, token(trust.Auditor, "fred"), "192.0.2.5:1"); w.Code != 429 || !strings.Contains(w.Body.String(), "auditor logins from address 192.0.2.5") {
		t.Fatalf("an auditor from a 6th address with the table full: %d %s; want 429", w.Code, w.Body)
	}
	expect("an operator from that address", loginFrom(h, token(trust.Operator, "otto"), "192.0.2.5:2"), 200, "otto")
}

// TestDocumentedLimits pins the bounds docs/console.md and docs/security.md print.
func TestDocumentedLimits(t *testing.T) {
	want := coordhttp.LoginLimits{PerToken: coordhttp.Rate{Burst: 10, Every: 6 * time.Second},
		PerAddress: coordhttp.Rate{Burst: 30, Every: 2 * time.Second}, MaxKeys: 4096}
	if coordhttp.DefaultLoginLimits != want || coordhttp.MaxSessionsPerToken != 8 || coordhttp.MaxSessionsPerRole != 512 ||
		coordhttp.MaxSessions != 1024 {
		t.Fatalf("limits %+v, %d per token, %d per role, %d in all: a change here changes docs/console.md, docs/security.md and this test",
			coordhttp.DefaultLoginLimits, coordhttp.MaxSessionsPerToken, coordhttp.MaxSessionsPerRole, coordhttp.MaxSessions)
	}
}
