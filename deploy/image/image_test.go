// Package image tests the OCI image `make image` builds (deploy/image/Containerfile): quotad
// runs from it as the whole development cluster, answers over TLS from the host, and the
// image's quotactl reads that cluster. The test needs podman and an image tag in QUOTA_IMAGE;
// the image step of `make test` sets both (docs/deploy.md, "The image").
package image

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
)

// imageUID is the user the image runs as (USER in the Containerfile).
const imageUID = 65532

// podmanTimeout bounds every podman command but the wait for health.
const podmanTimeout = 60 * time.Second

// healthTimeout bounds the wait for the container's region edge to answer.
const healthTimeout = 60 * time.Second

var devRegions = []string{"us", "eu"}

func TestImage(t *testing.T) {
	tag := os.Getenv("QUOTA_IMAGE")
	if tag == "" {
		t.Skip("QUOTA_IMAGE is not set: set it to a tag built by `make image` (the image step of make test does)")
	}
	data := writableDir(t)
	base := freeBase(t)
	prefix := dbPrefix(t)
	name := "quota-image-test-" + prefix
	t.Cleanup(func() {
		if out, err := podman(t, "rm", "-f", "-t", "5", name); err != nil {
			t.Logf("podman rm -f %s: %v: %s", name, err, out)
		}
	})
	out, err := podman(t, "run", "-d", "--name", name, "--network", "host",
		"-v", data+":/data:Z", tag, "dev",
		"--data-dir", "/data", "--certs-dir", "/data/certs", "--base-port", strconv.Itoa(base),
		"--regions", strings.Join(devRegions, ","), "--db-prefix", prefix,
		"--pg-url", testpg.AdminURL(), "--log-level", "warn")
	if err != nil {
		t.Fatalf("podman run %s: %v: %s", tag, err, out)
	}
	certs := filepath.Join(data, "certs")
	probes := []probe{{"https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(base+1000)) + "/metrics", "auditor"}}
	for i := range devRegions {
		probes = append(probes, probe{"https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(base+1001+i)) + "/v1/ping", "storefront"})
	}
	waitHealthy(t, name, certs, probes)

	out, err = podman(t, "run", "--rm", "--network", "host", "-v", data+":/data:Z",
		"--entrypoint", "/usr/local/bin/quotactl", tag,
		"--certs-dir", "/data/certs", "--coordinator", net.JoinHostPort("127.0.0.1", strconv.Itoa(base)),
		"--timeout", "20s", "regions")
	if err != nil {
		t.Fatalf("quotactl regions in the image: %v: %s", err, out)
	}
	for i, r := range devRegions {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(base+1+i))
		if !strings.Contains(out, r) || !strings.Contains(out, addr) {
			t.Errorf("quotactl regions does not name region %s at %s:\n%s", r, addr, out)
		}
	}
	checkStatus(t, tag, data, base)
}

// checkStatus runs the image's quotactl status against the development cluster: every region
// and the coordinator have a leader, and what it flags is only what a development cluster
// lacks by design (standbys), so its exit status is 1 for that alone.
func checkStatus(t *testing.T, tag, data string, base int) {
	t.Helper()
	out, err := podman(t, "run", "--rm", "--network", "host", "-v", data+":/data:Z",
		"--entrypoint", "/usr/local/bin/quotactl", tag,
		"--certs-dir", "/data/certs", "--coordinator", net.JoinHostPort("127.0.0.1", strconv.Itoa(base)),
		"--timeout", "20s", "status", "-o", "json")
	var st struct {
		Coordinator struct {
			Leader string `json:"leader"`
		} `json:"coordinator"`
		Regions []struct {
			Name   string `json:"name"`
			Leader string `json:"leader"`
		} `json:"regions"`
		Problems []string `json:"problems"`
	}
	start := strings.Index(out, "{")
	if start < 0 || json.Unmarshal([]byte(out[start:]), &st) != nil {
		t.Fatalf("quotactl status -o json in the image: %v: %s", err, out)
	}
	if st.Coordinator.Leader == "" || len(st.Regions) != len(devRegions) {
		t.Errorf("quotactl status: coordinator leader %q, %d regions; want a leader and %d regions:\n%s", st.Coordinator.Leader, len(st.Regions), len(devRegions), out)
	}
	for _, r := range st.Regions {
		if r.Leader == "" {
			t.Errorf("quotactl status: region %s has no leader:\n%s", r.Name, out)
		}
	}
	for _, p := range st.Problems {
		if !strings.Contains(p, "standby") {
			t.Errorf("quotactl status flags %q in a healthy development cluster:\n%s", p, out)
		}
	}
	if (err == nil) != (len(st.Problems) == 0) {
		t.Errorf("quotactl status: exit %v with problems %q; want exit 1 exactly when it flags one", err, st.Problems)
	}
}

// podman runs podman with the repository's engine configuration and podmanTimeout, and
// returns its combined output.
func podman(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podmanTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", args...)
	_, file, _, _ := runtime.Caller(0)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+filepath.Join(filepath.Dir(file), "containers.conf"))
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("podman %s: after %s: %w", args[0], podmanTimeout, ctx.Err())
	}
	return string(out), err
}

// writableDir is a fresh directory the image's user may write: its data and certificates.
func writableDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, imageUID, imageUID); err != nil {
		// Not root: let anyone write instead (the directory is inside the test's own).
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// dbPrefix is a fresh database prefix; the databases quotad dev creates with it are dropped
// at the end of the test.
func dbPrefix(t *testing.T) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	prefix := "quota_t_image_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		names := []string{prefix + "_coordinator"}
		for _, r := range devRegions {
			names = append(names, prefix+"_region_"+r)
		}
		for _, n := range names {
			if err := pgutil.DropDatabase(ctx, testpg.AdminURL(), n); err != nil {
				t.Logf("drop %s: %v", n, err)
			}
		}
	})
	return prefix
}

// freeBase finds a base port whose every port quotad dev binds is free on 127.0.0.1.
func freeBase(t *testing.T) int {
	t.Helper()
	offsets := []int{0, 90, 91, 1000}
	for i := range devRegions {
		offsets = append(offsets, 1+i, 1001+i)
	}
	for try := 0; try < 50; try++ {
		var b [2]byte
		if _, err := rand.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		base := 20000 + (int(b[0])<<8|int(b[1]))%30000
		if portsFree(base, offsets) {
			return base
		}
	}
	t.Fatal("no free base port in 50 tries")
	return 0
}

func portsFree(base int, offsets []int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close() // a probe listener; its close error changes nothing
		}
	}()
	for _, o := range offsets {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+o)))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

// probe is one health check: a GET of url that must answer 200 to the client certificate
// of role.
type probe struct{ url, role string }

// waitHealthy polls every probe over mutual TLS until each has answered 200, for at most
// healthTimeout in all; it fails with the container's log otherwise.
func waitHealthy(t *testing.T, name, certs string, probes []probe) {
	t.Helper()
	deadline := time.Now().Add(healthTimeout)
	var last error
	for len(probes) > 0 && time.Now().Before(deadline) {
		client, err := tlsClient(certs, probes[0].role)
		if err == nil {
			last = ping(client, probes[0].url)
			client.CloseIdleConnections()
			if last == nil {
				probes = probes[1:]
				continue
			}
		} else {
			last = err
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(probes) == 0 {
		return
	}
	logs, err := podman(t, "logs", "--tail", "50", name)
	if err != nil {
		logs = fmt.Sprintf("(podman logs: %v) %s", err, logs)
	}
	t.Fatalf("GET %s did not answer 200 within %s: %v\ncontainer log:\n%s", probes[0].url, healthTimeout, last, logs)
}

func ping(client *http.Client, url string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // a read-only GET; nothing to lose on close
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return nil
}

// tlsClient presents role's client certificate from certs and trusts only its ca.crt; it
// fails until quotad dev has written them.
func tlsClient(certs, role string) (*http.Client, error) {
	caPEM, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("ca.crt: no certificate")
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(certs, "client."+role+".crt"), filepath.Join(certs, "client."+role+".key"))
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
	}}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}, nil
}
