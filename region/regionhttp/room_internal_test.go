package regionhttp

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
)

// TestRoomCSPIsStrict: the policy has every directive the page needs and nothing more
// permissive: no source but 'self' (and 'none'), no inline code, no eval, no framing.
func TestRoomCSPIsStrict(t *testing.T) {
	want := map[string]string{"default-src": "'none'", "script-src": "'self'", "style-src": "'self'", "connect-src": "'self'",
		"frame-ancestors": "'none'", "base-uri": "'none'", "form-action": "'self'"}
	got := map[string]string{}
	for _, d := range strings.Split(RoomCSP, ";") {
		words := strings.Fields(d)
		if len(words) == 0 {
			continue
		}
		if _, dup := got[words[0]]; dup {
			t.Errorf("directive %s twice", words[0])
		}
		got[words[0]] = strings.Join(words[1:], " ")
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("directives %v, want exactly %v", got, want)
	}
	for _, bad := range []string{"unsafe", "*", "data:", "http:", "https:", "blob:"} {
		if strings.Contains(RoomCSP, bad) {
			t.Errorf("the policy allows %s: %s", bad, RoomCSP)
		}
	}
}

// TestRoomPageHasNoInlineCode: the page works under the policy: no inline script, style or
// event handler (which script-src and style-src 'self' block), and its files are its own.
func TestRoomPageHasNoInlineCode(t *testing.T) {
	html, err := roomFiles.ReadFile("room/room.html")
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAll(html, -1) {
		if !bytes.Contains(tag, []byte(` src="/room/assets/`)) {
			t.Errorf("script tag %s loads no file of the room's own", tag)
		}
	}
	for _, re := range []string{`<script[^>]*>\s*[^<\s]`, `\sstyle=`, `<style`, `\son[a-z]+=`, `javascript:`, `https?://`} {
		if m := regexp.MustCompile(re).Find(html); m != nil {
			t.Errorf("the page has %q (matches %s): the policy blocks it, or it is not the room's own", m, re)
		}
	}
	if !bytes.Contains(html, []byte(`<html lang="en">`)) || !bytes.Contains(html, []byte(`aria-live="polite"`)) {
		t.Error("the page lost its lang or its live region")
	}
}

// roomTest is a room handler with no front door: every answer that needs none (the page,
// its files, a refused link, an unknown route) is served.
func roomTest(t *testing.T) (http.Handler, *admission.Keyring, time.Time) {
	t.Helper()
	keys, err := admission.ParseKeyring([]byte("k1 " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	rh, err := newRoomHandler(nil, RoomOptions{Region: "us", Keys: func() *admission.Keyring { return keys }, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return rh.routes(), keys, now
}

func serve(h http.Handler, method, target, ctype, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if ctype != "" {
		r.Header.Set("Content-Type", ctype)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestRoomAnswersCarryTheHeaders: every answer, page, file, refusal or unknown route, carries
// the policy, nosniff and no referrer; a refused link says why on the page.
func TestRoomAnswersCarryTheHeaders(t *testing.T) {
	h, keys, now := roomTest(t)
	expired, err := keys.SignEntry("drop", "alice", now.Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, method, target, ctype, body string
		code                              int
		want                              string // in the body
	}{
		{"the page", "GET", "/room/drop", "", "", 200, `data-sale="drop"`},
		{"the page, an expired link", "GET", "/room/drop?" + expired.Encode(), "", "", 401, "expired at"},
		{"the page, a link without sig", "GET", "/room/drop?user=alice&exp=1800000060", "", "", 400, "invalid sig"},
		{"the page, a bad sale id", "GET", "/room/%2Fx", "", "", 404, "no such sale"},
		{"the page escapes the sale", "GET", "/room/" + url.PathEscape("<b>"), "", "", 404, "&lt;b&gt;"},
		{"the script", "GET", "/room/assets/room.js", "", "", 200, "sessionStorage"},
		{"the style", "GET", "/room/assets/room.css", "", "", 200, "focus-visible"},
		{"no such file", "GET", "/room/assets/x.js", "", "", 404, "NOT_FOUND"},
		{"enter, not JSON", "POST", "/room/drop/admissions", "text/plain", `{}`, 400, "Content-Type"},
		{"enter, a form post", "POST", "/room/drop/admissions", "application/x-www-form-urlencoded", `user=a`, 400, "Content-Type"},
		{"enter, no link", "POST", "/room/drop/admissions", "application/json", `{}`, 400, `"field":"user"`},
		{"enter, an expired link", "POST", "/room/drop/admissions", "application/json",
			`{"user":"alice","exp":"` + expired.Get("exp") + `","sig":"` + expired.Get("sig") + `"}`, 401, "expired at"},
		{"enter, another shopper's link", "POST", "/room/drop/admissions", "application/json",
			`{"user":"bob","exp":"` + expired.Get("exp") + `","sig":"` + expired.Get("sig") + `"}`, 401, "bad signature"},
		{"enter, an unknown field", "POST", "/room/drop/admissions", "application/json", `{"user_id":"alice"}`, 400, "user_id"},
		{"enter, a body too big", "POST", "/room/drop/admissions", "application/json", `{"user":"` + strings.Repeat("a", maxRoomBody) + `"}`, 400, "bytes"},
		{"the storefront API is not here", "POST", "/v1/sales/drop/reservations", "application/json", `{}`, 404, "NOT_FOUND"},
		{"metrics are not here", "GET", "/metrics", "", "", 404, "NOT_FOUND"},
		{"the page takes no post", "POST", "/room/drop", "application/json", `{}`, 404, "NOT_FOUND"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := serve(h, tt.method, tt.target, tt.ctype, tt.body)
			body, _ := io.ReadAll(w.Body)
			if w.Code != tt.code || !strings.Contains(string(body), tt.want) {
				t.Fatalf("%d %s; want %d with %q", w.Code, body, tt.code, tt.want)
			}
			for k, v := range map[string]string{"Content-Security-Policy": RoomCSP, "X-Content-Type-Options": "nosniff",
				"Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"} {
				if got := w.Header().Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}

// TestRoomFilesRevalidate: the static files have their type and an ETag that answers 304.
func TestRoomFilesRevalidate(t *testing.T) {
	h, _, _ := roomTest(t)
	w := serve(h, "GET", "/room/assets/room.js", "", "")
	if ct := w.Header().Get("Content-Type"); ct != "text/javascript; charset=utf-8" {
		t.Fatalf("room.js served as %q", ct)
	}
	r := httptest.NewRequest("GET", "/room/assets/room.js", nil)
	r.Header.Set("If-None-Match", w.Header().Get("ETag"))
	w2 := httptest.NewRecorder()
	h.ServeHTTP(w2, r)
	if w2.Code != http.StatusNotModified || w2.Body.Len() != 0 {
		t.Fatalf("a revalidation: %d with %d bytes", w2.Code, w2.Body.Len())
	}
}

func TestReturnTo(t *testing.T) {
	for _, c := range []struct{ back, want string }{
		{"https://shop.example/back", "https://shop.example/back?region=us&sale=drop&ticket=v1.a-b_c"},
		{"https://shop.example/back?from=room&ticket=forged", "https://shop.example/back?from=room&region=us&sale=drop&ticket=v1.a-b_c"},
		{"http://127.0.0.1:9000/", "http://127.0.0.1:9000/?region=us&sale=drop&ticket=v1.a-b_c"},
	} {
		got, err := ReturnTo(c.back, "v1.a-b_c", "drop", "us")
		if err != nil || got != c.want {
			t.Errorf("ReturnTo(%q) = %q, %v; want %q", c.back, got, err, c.want)
		}
	}
}
