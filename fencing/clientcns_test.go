package fencing_test

import (
	"slices"
	"testing"

	"github.com/quotaworks/quota/fencing"
)

// TestClientCNs: a member without the JSON gateway admits only the etcd users' certificates
// at the handshake; with the gateway (whose own call to the member cannot pass a CN filter)
// it filters none, and etcd's authentication alone decides.
func TestClientCNs(t *testing.T) {
	regions := []string{"us", "eu"}
	if got, want := fencing.ClientCNs(regions, false), fencing.Users(regions); !slices.Equal(got, want) || len(got) != 4 {
		t.Errorf("without the gateway: %q, want the users %q", got, want)
	}
	if got := fencing.ClientCNs(regions, true); got != nil {
		t.Errorf("with the gateway: %q, want no filter", got)
	}
}
