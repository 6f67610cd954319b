package transfer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/transfer"
)

func TestCheckReturnURL(t *testing.T) {
	for _, c := range []struct {
		url, want string // want: a word of the reason, "" for valid
	}{
		{"", ""},
		{"https://shop.example/checkout", ""},
		{"https://shop.example:8443/checkout?from=room&x=1", ""},
		{"http://127.0.0.1:9000/back", ""},
		{"http://127.9.9.9/back", ""},
		{"http://[::1]:9000/back", ""},
		{"http://localhost:9000/back", ""},
		{"http://shop.example/back", "https"},
		{"http://10.0.0.1/back", "https"},
		{"javascript:alert(1)", "scheme"},
		{"data:text/html,hi", "scheme"},
		{"ftp://shop.example/", "scheme"},
		{"//shop.example/checkout", "scheme"},
		{"/checkout", "scheme"},
		{"https:///checkout", "host"},
		{"https://user:pw@shop.example/", "user name"},
		{"https://shop.example/#frag", "fragment"},
		{"https://shop.example/#", "fragment"},
		{"https://shop.example/a b", "printable"},
		{"https://shop.example/\u00e9", "printable"},
		{"https://shop.example/\n", "printable"},
		{"https://shop.example/" + strings.Repeat("a", transfer.MaxReturnURLLen), "longer"},
		{"https://shop.example/%zz", "not a URL"},
	} {
		got := transfer.CheckReturnURL(c.url)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("CheckReturnURL(%q) = %q, want %q", c.url, got, c.want)
		}
	}
}

func TestReturnURLIsAWaitingRoomsTerm(t *testing.T) {
	field, why := transfer.AdmissionTerms{ReturnURL: "https://shop.example/"}.Check()
	if field != "admit_rate" || !strings.Contains(why, "room_return_url") {
		t.Errorf("a return URL without a waiting room: %q %q, want admit_rate naming room_return_url", field, why)
	}
	a := transfer.AdmissionTerms{Rate: 10, ReturnURL: "http://shop.example/"}.WithDefaults()
	if field, _ := a.Check(); field != "room_return_url" {
		t.Errorf("an http return URL: field %q, want room_return_url", field)
	}
	a.ReturnURL = "https://shop.example/"
	if field, why := a.Check(); field != "" {
		t.Errorf("a good return URL: %q %q", field, why)
	}
	if a.TicketTTL != 2*time.Minute {
		t.Errorf("defaults: %v", a)
	}
}
