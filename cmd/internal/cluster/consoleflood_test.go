package cluster_test

import (
	"crypto/rand"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/trust"
)

// consoleLogin logs in to the coordinator's console with tok and returns the status and the
// session cookie.
func consoleLogin(t *testing.T, c *http.Client, d *cluster.Dev, tok string) (int, string) {
	req, err := http.NewRequest("POST", "https://"+d.Coordinator.HTTPAddr()+coordhttp.Prefix+"api/login",
		strings.NewReader(`{"token":"`+tok+`"}`))
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	defer resp.Body.Close()
	for _, ck := range resp.Cookies() {
		if ck.Name == coordhttp.CookieName {
			return resp.StatusCode, ck.Value
		}
	}
	return resp.StatusCode, ""
}

// consoleSession is GET api/session's status with cookie.
func consoleSession(t *testing.T, c *http.Client, d *cluster.Dev, cookie string) int {
	t.Helper()
	req, err := http.NewRequest("GET", "https://"+d.Coordinator.HTTPAddr()+coordhttp.Prefix+"api/session", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(&http.Cookie{Name: coordhttp.CookieName, Value: cookie})
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestConsoleLoginFloodAndKeyReplace: against a running coordinator over TLS, 1,100 logins
// of one auditor token leave an operator able to log in and use the console; replacing the
// console key file (quotactl console keys create --overwrite writes a fresh key file over
// it) ends every session of the retired key when the coordinator reads the file again,
// within its 2 s poll: the table empties without any request, and the cookies answer 401.
func TestConsoleLoginFloodAndKeyReplace(t *testing.T) {
	d := startDev(t, "us")
	c := httpClient(t, "") // a browser has no client certificate
	ring := d.Coordinator.ConsoleKeys()
	sign := func(role trust.Role) string {
		tok, err := coordhttp.SignToken(ring, role, "flood-"+string(role), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	auditor := sign(trust.Auditor)
	var mu sync.Mutex
	codes := map[int]int{}
	var cookies []string
	var wg sync.WaitGroup
	started := time.Now()
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < 1100 && time.Since(started) < time.Minute; i += 8 {
				code, ck := consoleLogin(t, c, d, auditor)
				mu.Lock()
				codes[code]++
				if ck != "" {
					cookies = append(cookies, ck)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("1,100 auditor logins in %s: %v; sessions %v", time.Since(started).Round(time.Millisecond), codes, d.Coordinator.Console().Sessions())
	if codes[200]+codes[429] != 1100 || codes[200] == 0 || codes[200] > coordhttp.DefaultLoginLimits.PerToken.Burst {
		t.Fatalf("answers %v; want the token's burst of 200 and the rest 429", codes)
	}
	code, op := consoleLogin(t, c, d, sign(trust.Operator))
	if code != 200 || consoleSession(t, c, d, op) != 200 {
		t.Fatalf("the operator after the flood: login %d; want 200 and a working session", code)
	}
	data, err := admission.NewKeyFile(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(d.ConsoleKeys), ".new-console.keys") // replaced at once, as quotactl does
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, d.ConsoleKeys); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retired key's sessions to end", 10*time.Second, func() bool {
		n := d.Coordinator.Console().Sessions()
		return n[trust.Operator]+n[trust.Auditor] == 0
	})
	for _, ck := range []string{cookies[0], op} {
		if code := consoleSession(t, c, d, ck); code != 401 {
			t.Fatalf("a session of the retired key: %d; want 401", code)
		}
	}
}
