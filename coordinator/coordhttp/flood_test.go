package coordhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/trust"
)

// tlsConsole is the console over real TLS on loopback, with its key file swappable as the
// coordinator's reader swaps it.
type tlsConsole struct {
	t    *testing.T
	h    *coordhttp.Console
	keys atomic.Pointer[admission.Keyring]
	url  string
	c    *http.Client
}

func newTLSConsole(t *testing.T, limits *coordhttp.LoginLimits) *tlsConsole {
	k, _ := newKeys(t)
	tc := &tlsConsole{t: t}
	tc.keys.Store(k)
	tc.h = newHandler(t, &fakeBackend{}, coordhttp.Options{Keys: tc.keys.Load, Limits: limits,
		Logger: slog.New(slog.DiscardHandler)})
	srv := httptest.NewTLSServer(tc.h)
	t.Cleanup(srv.Close)
	tc.url, tc.c = srv.URL, srv.Client()
	tc.c.Timeout = 10 * time.Second
	tc.c.Transport.(*http.Transport).MaxIdleConnsPerHost = 16
	return tc
}

// loginAnswer is one login's answer: its status, Retry-After, error message and cookie.
type loginAnswer struct {
	code         int
	retry, error string
	cookie       string
}

func (tc *tlsConsole) login(tok string) loginAnswer {
	req, err := http.NewRequest("POST", tc.url+"/console/api/login", strings.NewReader(`{"token":"`+tok+`"}`))
	if err != nil {
		tc.t.Error(err)
		return loginAnswer{}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := tc.c.Do(req)
	if err != nil {
		tc.t.Error(err)
		return loginAnswer{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tc.t.Error(err)
	}
	a := loginAnswer{code: resp.StatusCode, retry: resp.Header.Get("Retry-After")}
	var e struct {
		Error struct{ Code, Message string }
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		a.error = e.Error.Code + ": " + e.Error.Message
	}
	for _, ck := range resp.Cookies() {
		if ck.Name == coordhttp.CookieName {
			a.cookie = ck.Value
		}
	}
	return a
}

// sessionCode is GET api/session's status with cookie.
func (tc *tlsConsole) sessionCode(cookie string) int {
	req, err := http.NewRequest("GET", tc.url+"/console/api/session", nil)
	if err != nil {
		tc.t.Fatal(err)
	}
	req.AddCookie(&http.Cookie{Name: coordhttp.CookieName, Value: cookie})
	resp, err := tc.c.Do(req)
	if err != nil {
		tc.t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		tc.t.Fatal(err)
	}
	return resp.StatusCode
}

// flood logs in n times with tok from 8 clients at once, as fast as they can (within a
// minute), and returns the answers by status, one answer of each, and every cookie.
func (tc *tlsConsole) flood(tok string, n int) (map[int]int, map[int]loginAnswer, []string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	codes, sample := map[int]int{}, map[int]loginAnswer{}
	var cookies []string
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				a := tc.login(tok)
				mu.Lock()
				codes[a.code]++
				if _, ok := sample[a.code]; !ok {
					sample[a.code] = a
				}
				if a.cookie != "" {
					cookies = append(cookies, a.cookie)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		tc.t.Fatalf("%d logins took over a minute", n)
	}
	return codes, sample, cookies
}

func total(m map[trust.Role]int) int { return m[trust.Operator] + m[trust.Auditor] }

// TestLoginFloodLeavesOperatorsIn: 1,100 logins of one auditor token, as fast as 8 clients
// over TLS can, leave the session table with room for an operator, who logs in and whose
// session works: under the default limits because the flood is refused 429 (Retry-After,
// naming the limit) after the token's burst; with the limits lifted because the token
// keeps at most MaxSessionsPerToken sessions. Then the key file is replaced (quotactl
// console keys create --overwrite): KeysChanged ends every session of the retired key at
// once, the table is empty, their cookies answer 401, and the new key's tokens log in.
func TestLoginFloodLeavesOperatorsIn(t *testing.T) {
	lifted := &coordhttp.LoginLimits{PerToken: coordhttp.Rate{Burst: 1 << 30, Every: time.Nanosecond},
		PerAddress: coordhttp.Rate{Burst: 1 << 30, Every: time.Nanosecond}, MaxKeys: 16}
	for _, tc := range []struct {
		name   string
		limits *coordhttp.LoginLimits
		want   int // logins answered 200
	}{
		{"rate limited", nil, coordhttp.DefaultLoginLimits.PerToken.Burst},
		{"limits lifted", lifted, 1100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTLSConsole(t, tc.limits)
			started := time.Now()
			codes, sample, cookies := c.flood(sign(t, c.keys.Load(), trust.Auditor, time.Now().Add(time.Hour)), 1100)
			t.Logf("1,100 auditor logins in %s: %v; sessions %v", time.Since(started).Round(time.Millisecond), codes, c.h.Sessions())
			if codes[200] != tc.want || codes[200]+codes[429] != 1100 {
				t.Fatalf("answers %v; want %d logins of 200 and the rest 429", codes, tc.want)
			}
			if a, ok := sample[429]; ok {
				if sec, err := strconv.Atoi(a.retry); err != nil || sec < 1 || !strings.Contains(a.error, "OVERLOADED: console login rate limit: logins of the auditor token of alice") {
					t.Fatalf("a refused login: Retry-After %q, %q; want seconds and the limit named", a.retry, a.error)
				}
			}
			if n := c.h.Sessions()[trust.Auditor]; n != min(tc.want, coordhttp.MaxSessionsPerToken) {
				t.Fatalf("%d auditor sessions kept; want at most MaxSessionsPerToken (%d)", n, coordhttp.MaxSessionsPerToken)
			}
			op := c.login(sign(t, c.keys.Load(), trust.Operator, time.Now().Add(time.Hour)))
			if op.code != 200 || c.sessionCode(op.cookie) != 200 {
				t.Fatalf("the operator after the flood: login %d %s; want 200 and a working session", op.code, op.error)
			}
			newKeyFile(t, c, append(cookies, op.cookie))
		})
	}
}

// newKeyFile replaces the console's keys as quotactl console keys create --overwrite does
// and checks that the old key's sessions (cookies) end at once and the new key logs in.
func newKeyFile(t *testing.T, c *tlsConsole, cookies []string) {
	t.Helper()
	had := total(c.h.Sessions())
	fresh, _ := newKeys(t)
	c.keys.Store(fresh)
	if n := c.h.KeysChanged(); n != had || total(c.h.Sessions()) != 0 {
		t.Fatalf("KeysChanged ended %d of %d sessions; %v are left", n, had, c.h.Sessions())
	}
	for _, ck := range cookies[len(cookies)-min(len(cookies), 3):] {
		if code := c.sessionCode(ck); code != 401 {
			t.Fatalf("a session of the retired key: %d; want 401", code)
		}
	}
	if a := c.login(sign(t, fresh, trust.Operator, time.Now().Add(time.Hour))); a.code != 200 || c.sessionCode(a.cookie) != 200 {
		t.Fatalf("an operator of the new key: %d %s", a.code, a.error)
	}
}
