package cluster_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/cmd/internal/cluster"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region/regionhttp"
)

// TestWaitingRoomPageAtAnEdge: a storefront edge started with RoomListen serves the region's
// waiting-room page to a browser (no client certificate): the page names the sale, with the
// room's headers; entry links are checked there (the sale's return URL comes from the
// leader); four shoppers enter through the page, poll it until admitted (some polls
// answered from the edge's copy of the line), and each one's return_to carries a ticket
// that reserves through the edge's storefront API. A poll of a sale no one knows is 404 from
// the leader's memory, costing no query.
func TestWaitingRoomPageAtAnEdge(t *testing.T) {
	t.Parallel() // its own cluster, no time bound
	const sale = "edgeroom"
	ec, e := startRoomEdge(t, sale)
	browser := httpClient(t, "")
	room := "https://" + e.RoomAddr()
	resp, err := browser.Get(room + "/room/" + sale)
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		resp.Header.Get("Content-Security-Policy") != regionhttp.RoomCSP || !strings.Contains(string(page), sale) {
		t.Fatalf("the page at the edge: %d %v %v\n%s", resp.StatusCode, resp.Header, err, page)
	}
	// The leader answers it from memory (its own page's poll), never looking the sale up in
	// its database: a lookup would answer `sale_id "no-such-sale": not found`.
	if a := call(t, browser, "GET", room+"/room/no-such-sale/admissions/0123456789abcdef0123456789abcdef", nil); a.code != http.StatusNotFound ||
		!strings.HasPrefix(a.errField("message"), "admission_id") {
		t.Errorf("a poll of a sale no one knows: %d %v", a.code, a.body)
	}
	shoppers := []string{"erin", "frank", "grace", "heidi"}
	ids := make([]string, len(shoppers))
	for i, u := range shoppers {
		q := signEntry(t, ec.keys, sale, u)
		if code := getPage(t, browser, room+"/room/"+sale+"?"+q.Encode()); code != http.StatusOK {
			t.Fatalf("%s's link on the page at the edge: %d", u, code)
		}
		body := map[string]string{"user": u, "exp": q.Get(admission.EntryExp), "sig": q.Get(admission.EntrySig)}
		if u == "erin" {
			bad := map[string]string{"user": "mallory", "exp": body["exp"], "sig": body["sig"]}
			if a := enterRoom(t, browser, room, sale, bad); a.code != http.StatusUnauthorized {
				t.Fatalf("another shopper's link at the edge: %d %v", a.code, a.body)
			}
		}
		a := enterRoom(t, browser, room, sale, body)
		if (a.code != http.StatusAccepted && a.code != http.StatusOK) || a.str("admission_id") == "" {
			t.Fatalf("%s entering through the edge's page: %d %v", u, a.code, a.body)
		}
		ids[i] = a.str("admission_id")
	}
	answered0, _ := e.Edge.Polls()
	sc := httpClient(t, trust.Storefront)
	for i, u := range shoppers {
		a := pollRoom(t, browser, room, sale, ids[i])
		back, err := url.Parse(a.str("return_to"))
		if err != nil || back.Host != "shop.example" || back.Query().Get(regionhttp.ReturnRegion) != "us" {
			t.Fatalf("%s admitted at the edge's page: %v %v", u, a.body, err)
		}
		r := reserveWith(t, sc, "https://"+e.Addr(), sale, back.Query().Get(regionhttp.ReturnTicket), "k-"+u, 1)
		if r.code != http.StatusCreated || r.str("user_id") != u {
			t.Fatalf("%s reserving with the page's ticket: %d %v", u, r.code, r.body)
		}
	}
	answered, forwarded := e.Edge.Polls()
	t.Logf("the page's polls: %d answered at the edge, %d forwarded", answered-answered0, forwarded)
	if answered == answered0 {
		t.Error("the edge answered none of the page's polls from its copy of the line")
	}
}

// startRoomEdge is an edge cluster with sale, whose waiting room admits 2 buyers a second
// and sends them back to https://shop.example/back, and an edge serving the page.
func startRoomEdge(t *testing.T, sale string) (*edgeCluster, *cluster.EdgeNode) {
	t.Helper()
	ec := newEdgeCluster(t, "edgeplain", 10, 10, 10)
	if _, err := ec.coord.CreateSale(ec.ctx, &quotav1.CreateSaleRequest{SaleId: sale, Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 10}},
		PerUserLimit: 1, HoldTtlMs: 60000, AdmitRate: 2, TicketTtlMs: 60000, MaxLiveTickets: 10, RoomReturnUrl: "https://shop.example/back"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ec.coord.Allocate(ec.ctx, &quotav1.AllocateRequest{SaleId: sale, RequestId: "alloc-" + sale,
		Weights: []*quotav1.RegionWeight{{Region: "us", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	e, err := cluster.StartEdge(cluster.EdgeConfig{Region: "us", Upstream: []string{ec.b.Addr(), ec.a.Addr()}, Listen: "127.0.0.1:0",
		RoomListen: "127.0.0.1:0", TicketKeys: ec.keys, Refresh: 100 * time.Millisecond, TLS: certs, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return ec, e
}

// getPage GETs a page and answers its status.
func getPage(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}

// enterRoom enters a waiting-room page's line with an entry link's fields, as its script does.
func enterRoom(t *testing.T, c *http.Client, room, sale string, link map[string]string) answer {
	t.Helper()
	b, err := json.Marshal(link)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Post(room+"/room/"+sale+"/admissions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode, header: resp.Header}
	if err := json.NewDecoder(resp.Body).Decode(&a.body); err != nil {
		t.Fatal(err)
	}
	return a
}

// pollRoom polls an admission at a waiting-room page until it is admitted (200), for at most
// 30 s.
func pollRoom(t *testing.T, c *http.Client, room, sale, id string) answer {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		a := call(t, c, "GET", room+"/room/"+sale+"/admissions/"+id, nil)
		switch {
		case a.code == http.StatusOK && a.str("state") == "admitted":
			return a
		case a.code != http.StatusAccepted:
			t.Fatalf("poll of %s at the page: %d %v", id, a.code, a.body)
		case time.Now().After(deadline):
			t.Fatalf("%s still queued after 30 s", id)
		}
	}
}

// signEntry is a signed entry link's query for user to sale, good for a minute, with the
// ticket key file at keysFile.
func signEntry(t *testing.T, keysFile, sale, user string) url.Values {
	t.Helper()
	data, err := os.ReadFile(keysFile)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := admission.ParseKeyring(data)
	if err != nil {
		t.Fatal(err)
	}
	q, err := keys.SignEntry(sale, user, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(fmt.Errorf("sign %s's entry link: %w", user, err))
	}
	return q
}
