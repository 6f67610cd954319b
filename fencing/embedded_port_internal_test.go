package fencing

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/quotaworks/quota/internal/testnet"
)

// TestEmbeddedOnATakenPortSaysAddressInUse: `quotad dev --base-port 0` picks etcd's ports
// and picks again when one was taken meanwhile, which it recognizes by EADDRINUSE.
func TestEmbeddedOnATakenPortSaysAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := "http://" + l.Addr().String()
	e, err := StartEmbedded(t.TempDir(), taken, testnet.URL(t))
	if err == nil {
		e.Close()
		t.Fatal("started on a taken port")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("err = %v, want one that is syscall.EADDRINUSE", err)
	}
}
