package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
	"github.com/spf13/viper"
)

// TestExpiredNodeCertificateFailsStart: a region or coordinator whose node.crt has expired
// does not start (every client would fail the handshake): the error names the file and says
// it expired, before any database or etcd is dialled.
func TestExpiredNodeCertificateFailsStart(t *testing.T) {
	dir := t.TempDir()
	if err := trust.CreateCA(dir, false); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateNode(dir, []string{"127.0.0.1"}, false, trust.ValidFor(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(dir, trust.NodeCert)
	for _, args := range [][]string{
		{"region", "--name", "us", "--db-url", "postgres://q@127.0.0.1:1/db", "--etcd", "http://127.0.0.1:1", "--certs-dir", dir},
		{"coordinator", "--db-url", "postgres://q@127.0.0.1:1/db", "--region", "us=127.0.0.1:1=postgres://q@127.0.0.1:1/us",
			"--etcd", "http://127.0.0.1:1", "--certs-dir", dir},
	} {
		root := rootCmd()
		root.SetArgs(args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		if !errors.Is(err, trust.ErrExpired) || !strings.Contains(err.Error(), node) {
			t.Errorf("quotad %s with an expired node.crt: %v; want it refused, naming %s", args[0], err, node)
		}
	}
}

// TestStartWarnsOfCertificatesNearTheirEnd: a server starts with a node.crt 10 days from its
// end, and warns naming the file and its days left.
func TestStartWarnsOfCertificatesNearTheirEnd(t *testing.T) {
	dir := t.TempDir()
	if err := trust.CreateCA(dir, false); err != nil {
		t.Fatal(err)
	}
	if err := trust.CreateNode(dir, []string{"127.0.0.1"}, false, trust.ValidFor(10*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	v := viper.New()
	v.Set("certs-dir", dir)
	if _, err := security(v, slog.New(slog.NewTextHandler(&buf, nil))); err != nil {
		t.Fatal(err)
	}
	logged := buf.String()
	if !strings.Contains(logged, "certificate expires soon") || !strings.Contains(logged, filepath.Join(dir, trust.NodeCert)) ||
		!strings.Contains(logged, "days_left=9") || strings.Contains(logged, trust.CACert) {
		t.Errorf("the start's log:\n%s\nwant one warning naming node.crt with 9 days left", logged)
	}
}
