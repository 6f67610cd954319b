package trust_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
)

const day = 24 * time.Hour

// listed is List(dir) now by file name.
func listed(t *testing.T, dir string) map[string]trust.CertInfo {
	t.Helper()
	certs, err := trust.List(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]trust.CertInfo{}
	for _, c := range certs {
		out[c.File] = c
	}
	return out
}

// TestListShowsDaysLeft: List gives each certificate's whole days left and flags one within
// ExpiresSoon "expires soon" (accepted still) and one past its NotAfter "expired" (refused).
func TestListShowsDaysLeft(t *testing.T) {
	dir := t.TempDir()
	if err := trust.CreateCA(dir, false); err != nil {
		t.Fatal(err)
	}
	for name, life := range map[string]time.Duration{"soon": 10 * day, "later": 40 * day, "gone": -time.Minute} {
		if err := trust.CreateClient(dir, trust.Operator, name, false, trust.ValidFor(life)); err != nil {
			t.Fatal(err)
		}
	}
	got := listed(t, dir)
	for file, want := range map[string]struct {
		days    int
		problem string
		refused bool
	}{
		"client.operator.soon.crt":  {9, trust.ProblemExpiresSoon, false},
		"client.operator.later.crt": {39, "", false},
		"client.operator.gone.crt":  {-1, trust.ProblemExpired, true},
		"ca.crt":                    {int(trust.CALifetime/day) - 1, "", false},
	} {
		c := got[file]
		if c.DaysLeft != want.days || c.Problem != want.problem || c.Refused() != want.refused {
			t.Errorf("%s: %d days left, problem %q, refused %v; want %d, %q, %v", file, c.DaysLeft, c.Problem, c.Refused(),
				want.days, want.problem, want.refused)
		}
	}
}

// TestEnsureDevRenews: EnsureDev makes again, from the same CA, a node certificate within
// ExpiresSoon of its end and a client certificate already expired, and nothing else.
func TestEnsureDevRenews(t *testing.T) {
	dir := t.TempDir()
	if _, err := trust.EnsureDev(dir, trust.DevHosts); err != nil {
		t.Fatal(err)
	}
	ca := read(t, dir, trust.CACert)
	if err := trust.CreateNode(dir, trust.DevHosts, true, trust.ValidFor(10*day)); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateClient(dir, trust.Operator, "", true, trust.ValidFor(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	made, err := trust.EnsureDev(dir, trust.DevHosts)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(made)
	if want := []string{"client.operator.crt", "client.operator.key", trust.NodeCert, trust.NodeKey}; !slices.Equal(made, want) {
		t.Errorf("made %v; want %v", made, want)
	}
	if !bytes.Equal(read(t, dir, trust.CACert), ca) {
		t.Error("the CA was made again")
	}
	for f, c := range listed(t, dir) {
		if c.Problem != "" || c.DaysLeft < int(trust.CertLifetime/day)-1 {
			t.Errorf("%s after EnsureDev: %d days left, problem %q", f, c.DaysLeft, c.Problem)
		}
	}
}

// TestEnsureDevAndTheCAsEnd: a CA within ExpiresSoon of its end is kept (a new one would cut
// off the clients of the old one while it works) and List flags it; an expired CA is made
// again, with node.crt and every role's certificate under it.
func TestEnsureDevAndTheCAsEnd(t *testing.T) {
	dir := t.TempDir()
	if err := trust.CreateCA(dir, false, trust.ValidFor(10*day)); err != nil {
		t.Fatal(err)
	}
	made, err := trust.EnsureDev(dir, trust.DevHosts)
	if err != nil || slices.Contains(made, trust.CACert) {
		t.Fatalf("a CA expiring in 10 days: made %v, %v; want it kept", made, err)
	}
	if c := listed(t, dir)[trust.CACert]; c.Problem != trust.ProblemExpiresSoon {
		t.Errorf("a CA expiring in 10 days is listed with problem %q; want %q", c.Problem, trust.ProblemExpiresSoon)
	}
	if err := trust.CreateCA(dir, true, trust.ValidFor(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if made, err = trust.EnsureDev(dir, trust.DevHosts); err != nil || len(made) != 2+2+2*len(trust.Roles) {
		t.Fatalf("an expired CA: made %v, %v; want everything again", made, err)
	}
	for f, c := range listed(t, dir) {
		if c.Problem != "" {
			t.Errorf("%s after the CA was made again: %s", f, c.Problem)
		}
	}
}

// TestLoadRefusesExpired: an expired node.crt fails the server's config and an expired
// ca.crt fails Load, each naming the file; what a process loaded is listed by Held.
func TestLoadRefusesExpired(t *testing.T) {
	dir := t.TempDir()
	if _, err := trust.EnsureDev(dir, trust.DevHosts); err != nil {
		t.Fatal(err)
	}
	m, err := trust.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ServerConfig(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ClientConfig(trust.Operator); err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, h := range m.Held() {
		files = append(files, h.File)
		if left := time.Until(h.NotAfter); left < trust.CertLifetime-day || left > trust.CALifetime {
			t.Errorf("%s held with %v left", h.File, left)
		}
	}
	if want := []string{trust.CACert, "client.operator.crt", trust.NodeCert}; !slices.Equal(files, want) {
		t.Errorf("Held %v; want %v", files, want)
	}
	if err := trust.CreateNode(dir, trust.DevHosts, true, trust.ValidFor(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err = m.ServerConfig()
	if !errors.Is(err, trust.ErrExpired) || !strings.Contains(err.Error(), filepath.Join(dir, trust.NodeCert)) {
		t.Errorf("an expired node.crt: %v; want ErrExpired naming the file", err)
	}
	if err := trust.CreateCA(dir, true, trust.ValidFor(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err = trust.Load(dir)
	if !errors.Is(err, trust.ErrExpired) || !strings.Contains(err.Error(), filepath.Join(dir, trust.CACert)) {
		t.Errorf("an expired ca.crt: %v; want ErrExpired naming the file", err)
	}
	if held := (*trust.Material)(nil).Held(); held != nil {
		t.Errorf("insecure holds %v", held)
	}
}

func read(t *testing.T, dir, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
