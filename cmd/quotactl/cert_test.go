package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
)

// TestCertListShowsExpiry: cert list shows each certificate's days left and flags one within
// 30 days "expires soon" (exit 0: it still works) and an expired one (exit 1); -o json has
// days_left.
func TestCertListShowsExpiry(t *testing.T) {
	dir := t.TempDir()
	if err := trust.CreateCA(dir, false); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateNode(dir, []string{"localhost"}, false, trust.ValidFor(10*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "cert", "list", "--certs-dir", dir)
	if err != nil {
		t.Fatalf("a certificate expiring in 10 days: %v (%s); want exit 0", err, out)
	}
	node := lineOf(out, "node.crt")
	if !strings.Contains(node, "(9 days left)") || !strings.Contains(node, "PROBLEM: expires soon") {
		t.Errorf("node.crt's line %q; want 9 days left and expires soon", node)
	}
	if ca := lineOf(out, "ca.crt"); !strings.Contains(ca, "days left)") || strings.Contains(ca, "PROBLEM") {
		t.Errorf("ca.crt's line %q; want its days left and no problem", ca)
	}
	out, err = run(t, "cert", "list", "--certs-dir", dir, "-o", "json")
	var got struct {
		Certificates []trust.CertInfo `json:"certificates"`
	}
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || len(got.Certificates) != 2 || got.Certificates[1].DaysLeft != 9 ||
		!strings.Contains(out, `"days_left": 9`) {
		t.Errorf("-o json: %v\n%s", err, out)
	}
	if err := trust.CreateClient(dir, trust.Operator, "", false, trust.ValidFor(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "cert", "list", "--certs-dir", dir)
	if line := lineOf(out, "client.operator.crt"); err == nil || exitCode(err) != 1 || !strings.Contains(line, "(expired)  PROBLEM: expired") {
		t.Errorf("an expired certificate: exit %d, line %q; want exit 1 and the line flagged", exitCode(err), line)
	}
}

// lineOf is the line of out that starts with prefix.
func lineOf(out, prefix string) string {
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
