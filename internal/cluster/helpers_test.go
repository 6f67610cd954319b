package cluster_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/cluster"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
)

func randHex(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func dropDBs(t *testing.T, prefix string, regions []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, role := range append([]string{"coordinator"}, regions...) {
		if err := pgutil.DropDatabase(ctx, testpg.AdminURL(), cluster.DBName(prefix, role)); err != nil {
			t.Logf("drop: %v", err)
		}
	}
}
