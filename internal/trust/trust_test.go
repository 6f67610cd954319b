package trust_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
)

// TestEnsureDevMakesWhatIsMissing: a fresh directory gets the CA, the node certificate and a
// client certificate per role, keys 0600; a second call makes nothing; a lost client
// certificate is made again, signed by the same CA.
func TestEnsureDevMakesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	made, err := trust.EnsureDev(dir, trust.DevHosts)
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 2+2+2*len(trust.Roles) {
		t.Errorf("made %v; want the CA, the node pair and a pair per role", made)
	}
	for _, f := range made {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Ext(f) == ".key" && st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v; want 0600", f, st.Mode().Perm())
		}
	}
	if again, err := trust.EnsureDev(dir, trust.DevHosts); err != nil || len(again) != 0 {
		t.Errorf("second EnsureDev: made %v, %v; want nothing", again, err)
	}
	if err := os.Remove(filepath.Join(dir, trust.ClientCert(trust.Auditor, ""))); err != nil {
		t.Fatal(err)
	}
	if again, err := trust.EnsureDev(dir, trust.DevHosts); err != nil || !slices.Contains(again, "client.auditor.crt") {
		t.Errorf("after losing the auditor's certificate: made %v, %v", again, err)
	}
	certs, err := trust.List(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roles := map[trust.Role]bool{}
	for _, c := range certs {
		if c.Problem != "" {
			t.Errorf("%s: %s", c.File, c.Problem)
		}
		roles[c.Role] = true
	}
	for _, r := range trust.Roles {
		if !roles[r] {
			t.Errorf("no certificate names role %s: %+v", r, certs)
		}
	}
}

// TestCertProblems: List flags an expired certificate and one signed by another CA; a
// missing CA with certificates present is refused rather than replaced.
func TestCertProblems(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if _, err := trust.EnsureDev(d, trust.DevHosts); err != nil {
			t.Fatal(err)
		}
	}
	// other's operator certificate, copied into dir, is not signed by dir's CA
	for _, f := range []string{"client.operator.crt", "client.operator.key"} {
		data, err := os.ReadFile(filepath.Join(other, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	certs, err := trust.List(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range certs {
		if want := c.File == "client.operator.crt"; (c.Problem != "") != want {
			t.Errorf("%s: problem %q; want a problem only for the foreign certificate", c.File, c.Problem)
		}
	}
	late, err := trust.List(dir, time.Now().Add(trust.CertLifetime+24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range late {
		if c.Kind != "ca" && c.Problem != "expired" {
			t.Errorf("%s after its lifetime: %q; want expired", c.File, c.Problem)
		}
	}
	if err := os.Remove(filepath.Join(dir, trust.CACert)); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.EnsureDev(dir, trust.DevHosts); err == nil {
		t.Error("EnsureDev replaced a lost CA while certificates it signed remain")
	}
}

// TestCreateRefusesToOverwrite: every create command keeps an existing file unless told.
func TestCreateRefusesToOverwrite(t *testing.T) {
	dir := t.TempDir()
	if err := trust.CreateCA(dir, false); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateCA(dir, false); !errors.Is(err, trust.ErrExists) {
		t.Errorf("second create-ca: %v; want ErrExists", err)
	}
	if err := trust.CreateClient(dir, trust.Storefront, "shop-eu", false); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateClient(dir, trust.Storefront, "shop-eu", false); !errors.Is(err, trust.ErrExists) {
		t.Errorf("second create-client: %v; want ErrExists", err)
	}
	if err := trust.CreateClient(dir, trust.Storefront, "shop-eu", true); err != nil {
		t.Errorf("create-client --overwrite: %v", err)
	}
	if err := trust.CreateClient(dir, "admin", "", false); err == nil {
		t.Error("a client certificate of an unknown role was made")
	}
	if err := trust.CreateNode(dir, nil, false); err == nil {
		t.Error("a node certificate with no host was made")
	}
	if _, err := trust.Load(t.TempDir()); err == nil {
		t.Error("Load of a directory without ca.crt succeeded")
	}
}

// TestEnsureDevRemakesANodeCertificateForNewHosts: a node certificate that does not name a
// host the servers now answer on is made again; the CA and client certificates stay.
func TestEnsureDevRemakesANodeCertificateForNewHosts(t *testing.T) {
	dir := t.TempDir()
	if _, err := trust.EnsureDev(dir, trust.DevHosts); err != nil {
		t.Fatal(err)
	}
	made, err := trust.EnsureDev(dir, append(slices.Clone(trust.DevHosts), "127.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(made, []string{trust.NodeCert, trust.NodeKey}) {
		t.Errorf("made %v; want only the node pair again", made)
	}
}

// TestMetricsRoles pins who may read /metrics (docs/security.md): operators and auditors; any
// other role, a certificate naming none, and no certificate are refused, each as the RPCs
// refuse them.
func TestMetricsRoles(t *testing.T) {
	want := map[trust.Role]bool{trust.Operator: true, trust.Auditor: true}
	for _, role := range trust.Roles {
		err := trust.AuthorizeMetrics(trust.Caller{Role: role, Name: "x", Certified: true})
		if want[role] != (err == nil) {
			t.Errorf("role %s reading metrics: %v; allowed should be %v", role, err, want[role])
		}
		if err != nil && !errors.Is(err, apierr.ErrPermissionDenied) {
			t.Errorf("role %s refused with %v; want PermissionDenied", role, err)
		}
	}
	if err := trust.AuthorizeMetrics(trust.Caller{Name: "node", Certified: true}); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Errorf("a certificate naming no role: %v; want PermissionDenied", err)
	}
	if err := trust.AuthorizeMetrics(trust.Caller{Role: trust.Operator}); !errors.Is(err, apierr.ErrUnauthenticated) {
		t.Errorf("no certificate: %v; want Unauthenticated", err)
	}
	if len(trust.MetricsRoles) != len(want) {
		t.Errorf("MetricsRoles %v; documented %v", trust.MetricsRoles, want)
	}
}
