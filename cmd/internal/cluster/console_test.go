package cluster_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
)

// The console's acceptance runs the web console in a real headless Chromium (Debian's
// chromium package, scripts/chromium-setup.sh) against a real cluster over real TLS.
// Screenshots go to $QUOTA_CONSOLE_SCREENSHOTS (default a temporary directory).

// chromiumPath finds the browser: under CI=true a missing browser fails the test, elsewhere
// it skips it, saying how to install it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const how = "no chromium on PATH: run scripts/chromium-setup.sh (apt-get install chromium)"
	if os.Getenv("CI") == "true" {
		t.Fatal(how + "; CI must run the browser test")
	}
	t.Skip(how)
	return ""
}

// spkiHash is the base64 SHA-256 of the node certificate's public key: Chromium trusts that
// key alone (--ignore-certificate-errors-spki-list), not every certificate.
func spkiHash(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(certs.Dir(), "node.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("node.crt: no PEM block")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// newBrowser starts a headless Chromium with a fresh profile for the whole test and
// returns its first tab's context (each login takes a browser context of its own from it).
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(chromiumPath(t)), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("ignore-certificate-errors-spki-list", spkiHash(t)),
		chromedp.WindowSize(1280, 1000)}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// tab is one browser context (its own cookies: one login) with one tab.
func tab(t *testing.T, browser context.Context) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // opens the tab
		t.Fatalf("open a tab: %v", err)
	}
	return ctx
}

// step runs browser actions with a deadline.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		failStep(t, ctx, what, err)
	}
}

// failStep fails the test for a browser step that ended in err, with what the page shows.
func failStep(t *testing.T, ctx context.Context, what string, err error) {
	t.Helper()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	status, serr := chromedp.Run(dctx, chromedp.Evaluate[string](`document.getElementById('status').textContent`))
	main, merr := chromedp.Run(dctx, chromedp.Evaluate[string](`document.getElementById('main').innerText.slice(0, 2000)`))
	t.Fatalf("browser: %s: %v; the page's status %q (%v), its text:\n%s (%v)", what, err, status, serr, main, merr)
}

// click clicks the element sel matches, as a person would. The console redraws its tables on
// every refresh, so an element found for a click can be replaced before the click lands
// (Chrome answers "Could not find node with given id"); the click is then tried again on the
// new element, a few times, before the step fails.
func click(t *testing.T, ctx context.Context, what, sel string) {
	t.Helper()
	for try := 1; ; try++ {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := chromedp.Do(sctx, chromedp.Click(chromedp.CSS(sel)))
		cancel()
		switch {
		case err == nil:
			return
		case try == 4 || !strings.Contains(err.Error(), "Could not find node"):
			failStep(t, ctx, what, err)
		}
		t.Logf("browser: %s: the page redrew the element under the click (%v); clicking again", what, err)
	}
}

// eval evaluates a JavaScript expression (awaiting a promise) in the tab.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

// screenshot saves the tab's whole page as name.png in the screenshots directory.
func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", filepath.Join(dir, name+".png"))
}

func screenshotsDir(t *testing.T) string {
	dir := os.Getenv("QUOTA_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startConsoleCoordinator starts the cluster's coordinator with its HTTP listener and a
// console key file, and returns it with the keys' path. A transfer whose step fails is
// flagged stranded at once, and the driver does not retry it within the test (an hour), so
// only the page's resolve finishes it.
func startConsoleCoordinator(t *testing.T, tc *testCluster) (*cluster.CoordinatorNode, string) {
	t.Helper()
	keys := filepath.Join(t.TempDir(), cluster.ConsoleKeysFile)
	if made, err := cluster.EnsureConsoleKeys(keys); err != nil || !made {
		t.Fatalf("console keys: %v, made %v", err, made)
	}
	if st, err := os.Stat(keys); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("console keys: %v, mode %v; want 0600", err, st.Mode())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := cluster.StartCoordinator(ctx, cluster.CoordinatorConfig{Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", DBURL: tc.ledger,
		Regions: tc.eps, LeaseTTL: 2 * time.Second, StrandAfter: time.Nanosecond, RetryInterval: time.Hour,
		TLS: certs, ConsoleKeys: keys, Logger: testLogger(),
		// The rebalancer does not run by itself here; its plan reads a minute of demand, so
		// the page's plan stands still while the test clicks.
		Auto: coordinator.AutoRebalance{Policy: transfer.Policy{Window: time.Minute, Horizon: 10 * time.Minute, MinUnits: 5}}}, tc.etcd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	if err := n.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	return n, keys
}

// login opens the console in a fresh browser context and logs in with a token of role.
func login(t *testing.T, browser context.Context, n *cluster.CoordinatorNode, role trust.Role) context.Context {
	t.Helper()
	tok, err := coordhttp.SignToken(n.ConsoleKeys(), role, "test-"+string(role), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx := tab(t, browser)
	step(t, ctx, "log in as "+string(role), chromedp.Navigate("https://"+n.HTTPAddr()+"/"),
		chromedp.WaitVisible(chromedp.CSS("#token")), chromedp.SetValue(chromedp.CSS("#token"), tok),
		chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS(`#who[data-role="`+string(role)+`"]`)))
	return ctx
}

type pagePool struct {
	SKU, Region           string
	Available, Held, Sold int64
}

// pagePools reads every pool row the sale page shows.
func pagePools(t *testing.T, ctx context.Context) []pagePool {
	return eval[[]pagePool](t, ctx, `Array.from(document.querySelectorAll('tr.pool')).map(r => ({SKU: r.dataset.sku,
		Region: r.dataset.region, Available: +r.querySelector('td.available').textContent,
		Held: +r.querySelector('td.held').textContent, Sold: +r.querySelector('td.sold').textContent}))`)
}

// stockPools is what quotactl stock prints: every region's GetStock, as an operator.
func stockPools(t *testing.T, tc *testCluster, sale string) []pagePool {
	t.Helper()
	var out []pagePool
	for _, name := range []string{"us", "eu", "ap"} {
		c := quotav1.NewRegionServiceClient(dial(t, tc.regions[name].Addr(), trust.Operator))
		st, err := c.GetStock(context.Background(), &quotav1.GetStockRequest{SaleId: sale})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.GetPools() {
			out = append(out, pagePool{p.GetSku(), p.GetRegion(), p.GetAvailable(), p.GetHeld(), p.GetSold()})
		}
	}
	return out
}

func sortPools(ps []pagePool) []pagePool {
	sort.Slice(ps, func(i, j int) bool { return ps[i].SKU+"/"+ps[i].Region < ps[j].SKU+"/"+ps[j].Region })
	return ps
}

// postAs posts a change from the tab's page with its session's CSRF token, as a handcrafted
// request would, and returns the HTTP status.
func postAs(t *testing.T, ctx context.Context, path, body string) int {
	return eval[int](t, ctx, fmt.Sprintf(`(async () => {
		const s = await (await fetch('/console/api/session')).json();
		const r = await fetch(%q, {method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf}, body: %q});
		return r.status; })()`, path, body))
}

// TestConsoleInABrowser: on a real cluster, an operator's console shows each region's pool
// as quotactl stock does, lists a stranded transfer first with its reason, and resolves it
// from the page; an auditor's console shows the same with no action button, and its posts
// of the actions are refused 403 and change nothing.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel() // its own cluster, no time bound (newTestCluster)
	browser := newBrowser(t)
	tc := newTestCluster(t, "us", "eu", "ap")
	n, _ := startConsoleCoordinator(t, tc)
	c := tc.coordinator(n)
	ctx := context.Background()
	shots := screenshotsDir(t)
	createSale(t, c, "flash", 1000, 5, time.Minute) // us 400, eu 350, ap 250
	us := tc.region("us")
	for i := range 3 { // 3 held at us, one of them paid
		r, err := us.Reserve(ctx, &quotav1.ReserveRequest{SaleId: "flash", Sku: "phone", UserId: "u" + itoa(i), Quantity: 2, RequestKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if _, err := us.Confirm(ctx, &quotav1.ConfirmRequest{HoldId: r.GetReservation().GetHoldId(), PaymentId: "p0"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	op := login(t, browser, n, trust.Operator)
	step(t, op, "the overview lists the sale", chromedp.WaitVisible(chromedp.CSS(`tr.sale[data-sale="flash"]`)))
	screenshot(t, op, shots, "overview")
	click(t, op, "open the sale", `tr.sale[data-sale="flash"] a`)
	step(t, op, "the sale's pools", chromedp.WaitVisible(chromedp.CSS(`tr.pool[data-region="ap"]`)))
	samePools(t, op, tc)
	screenshot(t, op, shots, "sale")
	id := strandTransfer(t, tc, c)
	row := `tr.transfer[data-id="` + id + `"]`
	step(t, op, "the stranded transfer is listed", chromedp.WaitVisible(chromedp.CSS(row+`[data-stranded="true"]`)))
	reason := eval[string](t, op, `document.querySelector('`+row+` .reason').textContent`)
	first := eval[string](t, op, `document.querySelector('#transfers tr.transfer').dataset.id`)
	g, err := c.GetTransfer(ctx, &quotav1.GetTransferRequest{TransferId: id})
	if err != nil || reason == "" || reason != g.GetTransfer().GetReason() || first != id {
		t.Fatalf("page shows reason %q, first row %s; ledger %v, %v; want the ledger's reason, the stranded transfer first", reason, first, g, err)
	}
	screenshot(t, op, shots, "stranded")
	auditorSeesNoActions(t, browser, n, tc, c, id, shots)
	tc.proxies["eu"].Heal()
	resolveFromPage(t, op, c, id)
	step(t, op, "the page shows the transfer posted", chromedp.WaitVisible(chromedp.CSS(row+`[data-state="posted"][data-stranded="false"]`)))
	if a := auditOK(t, c, "flash"); a.GetInFlight() != 0 || a.GetStranded() != 0 {
		t.Fatalf("audit after the resolve: %v", a)
	}
	samePools(t, op, tc)
	screenshot(t, op, shots, "resolved")
	applyFromPage(t, op, tc, c, shots)
}

// applyFromPage: a sale whose buyers all came to ap shows the rebalancer's plan of moves
// toward ap; the operator's "apply now" starts them as fenced transfers, the pools then
// match quotactl stock again and the audit is clean.
func applyFromPage(t *testing.T, op context.Context, tc *testCluster, c quotav1.CoordinatorServiceClient, shots string) {
	t.Helper()
	createSale(t, c, "apply", 30, 5, time.Minute)
	before := tc.stock("ap", "apply").GetAvailable()
	if _, err := tc.region("ap").Reserve(context.Background(), &quotav1.ReserveRequest{SaleId: "apply", Sku: "phone", UserId: "buyer",
		Quantity: 5, RequestKey: "k"}); err != nil {
		t.Fatal(err)
	}
	eval[string](t, op, `location.hash = '#/sale/apply'`)
	// The sale flash's page, still shown until the new one renders, has a plan for phone too.
	step(t, op, "open the sale with demand at ap", chromedp.WaitVisible(chromedp.CSS(`#sale[data-sale="apply"]`)),
		chromedp.WaitVisible(chromedp.CSS(`div.plan[data-sku="phone"] button.apply`)))
	screenshot(t, op, shots, "plan")
	click(t, op, "apply the plan", `div.plan[data-sku="phone"] button.apply`)
	for deadline := time.Now().Add(15 * time.Second); !movedToAP(t, c); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no transfer of the plan reached ap in 15 s; the page's status: %s; transfers %v", eval[string](t, op, `document.getElementById('status').textContent`), listTransfers(t, c, "apply"))
		}
	}
	if after := tc.stock("ap", "apply").GetAvailable(); after <= before-5 {
		t.Fatalf("ap has %d available after the apply (%d before the 5 held); want more", after, before)
	}
	auditOK(t, c, "apply")
}

// movedToAP reports whether a transfer between regions has posted units to ap in the sale apply.
func movedToAP(t *testing.T, c quotav1.CoordinatorServiceClient) bool {
	for _, tr := range listTransfers(t, c, "apply") {
		if tr.GetFrom() != transfer.Unallocated && tr.GetTo() == "ap" && tr.GetState() == "posted" {
			return true
		}
	}
	return false
}

// resolveFromPage clicks the transfer's resolve button until the ledger has it posted, as an
// operator would: right after eu is back the coordinator's connection to it may still be
// waiting to reconnect, and a resolve then leaves the transfer stranded, which the page says.
func resolveFromPage(t *testing.T, ctx context.Context, c quotav1.CoordinatorServiceClient, id string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		click(t, ctx, "click resolve", `button.resolve[data-id="`+id+`"]`)
		for wait := time.Now().Add(2 * time.Second); time.Now().Before(wait); time.Sleep(100 * time.Millisecond) {
			g, err := c.GetTransfer(context.Background(), &quotav1.GetTransferRequest{TransferId: id})
			if err == nil && g.GetTransfer().GetState() == "posted" {
				return
			}
		}
		t.Logf("after a resolve from the page: %s", eval[string](t, ctx, `document.getElementById('status').textContent`))
	}
	t.Fatalf("the page's resolve never posted transfer %s", id)
}

// samePools waits until the page's pools equal what the regions report (quotactl stock).
func samePools(t *testing.T, ctx context.Context, tc *testCluster) {
	t.Helper()
	var page, stock []pagePool
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		page, stock = sortPools(pagePools(t, ctx)), sortPools(stockPools(t, tc, "flash"))
		if fmt.Sprint(page) == fmt.Sprint(stock) && len(page) == 3 {
			return
		}
	}
	t.Fatalf("the page shows pools %v; quotactl stock %v", page, stock)
}

// strandTransfer cuts the coordinator off from eu and moves 50 units us → eu: debited at us,
// the credit unanswered, the transfer is flagged stranded. It returns the transfer's id.
func strandTransfer(t *testing.T, tc *testCluster, c quotav1.CoordinatorServiceClient) string {
	t.Helper()
	tc.proxies["eu"].Cut()
	r, err := c.Transfer(context.Background(), &quotav1.TransferRequest{SaleId: "flash", Sku: "phone", From: "us", To: "eu", Units: 50, RequestId: "cut-1"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetTransfer().GetTransferId()
	waitFor(t, "the transfer to be flagged stranded", 15*time.Second, func() bool {
		g, err := c.GetTransfer(context.Background(), &quotav1.GetTransferRequest{TransferId: id})
		return err == nil && g.GetTransfer().GetStranded() && g.GetTransfer().GetReason() != ""
	})
	return id
}

// auditorSeesNoActions logs in as an auditor: the sale page lists the stranded transfer and
// the plan but no action button, and posting the actions anyway is refused 403 with the
// ledger unchanged.
func auditorSeesNoActions(t *testing.T, browser context.Context, n *cluster.CoordinatorNode, tc *testCluster,
	c quotav1.CoordinatorServiceClient, id string, shots string) {
	t.Helper()
	au := login(t, browser, n, trust.Auditor)
	step(t, au, "the auditor opens the sale", chromedp.Navigate("https://"+n.HTTPAddr()+"/console/#/sale/flash"),
		chromedp.WaitVisible(chromedp.CSS(`tr.transfer[data-id="`+id+`"][data-stranded="true"]`)),
		chromedp.WaitVisible(chromedp.CSS(`div.plan[data-sku="phone"]`)))
	if k := eval[int](t, au, `document.querySelectorAll('button.action').length`); k != 0 {
		t.Fatalf("the auditor's page has %d action buttons; want none", k)
	}
	samePools(t, au, tc)
	screenshot(t, au, shots, "auditor")
	before := len(listTransfers(t, c, "flash"))
	if code := postAs(t, au, "/console/api/transfers/"+id+"/resolve", `{"refuse":true}`); code != 403 {
		t.Fatalf("the auditor's resolve: %d; want 403", code)
	}
	if code := postAs(t, au, "/console/api/sales/flash/rebalance", `{"sku":"phone","request_id":"auditor-1"}`); code != 403 {
		t.Fatalf("the auditor's rebalance: %d; want 403", code)
	}
	g, err := c.GetTransfer(context.Background(), &quotav1.GetTransferRequest{TransferId: id})
	if err != nil || !g.GetTransfer().GetStranded() || g.GetTransfer().GetState() != "pending" || len(listTransfers(t, c, "flash")) != before {
		t.Fatalf("after the auditor's refused posts: %v, %v; want the transfer still stranded and no new transfer", g, err)
	}
}
