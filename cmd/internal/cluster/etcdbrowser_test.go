package cluster_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/fencing"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
)

// crossOriginPage is a page of another origin that tries, with text/plain POSTs (which a
// browser sends without asking the server first), to write a binding through etcd's JSON
// gateway and to read every binding, and reports what the browser let it read. The binding
// names a region that exists, so the coordinator's check of bindings keeps it.
const crossOriginPage = `<!doctype html><title>elsewhere</title><script>
async function attack(etcd) {
  const b64 = s => btoa(s);
  const out = {};
  const post = async (path, body) => {
    try {
      const r = await fetch(etcd + path, {method: 'POST', headers: {'Content-Type': 'text/plain'}, body: JSON.stringify(body)});
      return 'status ' + r.status + ' ' + (await r.text()).slice(0, 200);
    } catch (e) { return 'error ' + e; }
  };
  out.put = await post('/v3/kv/put', {key: b64('/quota/bind/s|victim-1'), value: b64('us')});
  out.range = await post('/v3/kv/range', {key: b64('/quota/bind/'), range_end: b64('/quota/bind0')});
  return JSON.stringify(out);
}
</script>`

// TestEtcdRefusesAWebPage opens a page of another origin in headless Chromium and has it post
// to quotad dev's embedded etcd: secure (the default) and --insecure, the browser lets the
// page read no answer and etcd holds no binding. With the JSON gateway turned on under
// --insecure (what every etcd did before), the same page writes the binding: the test sees a
// write when there is one.
func TestEtcdRefusesAWebPage(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	browser := newBrowser(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if _, err := w.Write([]byte(crossOriginPage)); err != nil {
			t.Errorf("serve the page: %v", err)
		}
	}))
	defer page.Close()
	for _, tc := range []struct {
		name              string
		insecure, gateway bool
		wantWrite         bool
	}{
		{"secure", false, false, false},
		{"insecure", true, false, false},
		{"insecure with the gateway on", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDevMode(t, tc.insecure, tc.gateway)
			ctx := tab(t, browser)
			step(t, ctx, "open the other origin's page", chromedp.Navigate(page.URL))
			raw := eval[string](t, ctx, "attack("+jsString(d.Etcd.ClientURL)+")")
			var out map[string]string
			if err := json.Unmarshal([]byte(raw), &out); err != nil {
				t.Fatalf("page answer %q: %v", raw, err)
			}
			bctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			bound, ok, err := fencing.Bound(bctx, d.EtcdClient, "s", "victim-1")
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.wantWrite {
				t.Errorf("binding of victim-1 after the page: %q, %v; want written %v (page saw %v)", bound, ok, tc.wantWrite, out)
			}
			readable := strings.HasPrefix(out["range"], "status 200")
			if readable != tc.wantWrite {
				t.Errorf("the page read etcd's answer: %v; want %v (%v)", readable, tc.wantWrite, out)
			}
		})
	}
}

// startDevMode starts a one-region dev cluster, secure or --insecure, with or without the
// embedded etcd's JSON gateway.
func startDevMode(t *testing.T, insecure, gateway bool) *cluster.Dev {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := "quota_t_" + randHex(t)
	cfg := cluster.DevConfig{Regions: []string{"us"}, PGURL: testpg.AdminURL(), DBPrefix: prefix, DataDir: t.TempDir(), Host: "127.0.0.1",
		LeaseTTL: 2 * time.Second, Logger: testLogger(), Region: region.Config{Verify: verify()}, Insecure: insecure, EtcdGateway: gateway}
	if !insecure {
		cfg.CertsDir = certs.Dir()
	}
	d, err := cluster.StartDev(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		dropDBs(t, prefix, cfg.Regions)
	})
	return d
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a string always marshals
	}
	return string(b)
}
