package cluster_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/cluster"
	"github.com/quotaworks/quota/internal/pgutil"
	"github.com/quotaworks/quota/internal/testpg"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// testLogger keeps test output to warnings and errors.
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func isNotFoundErr(err error) bool { return status.Code(err) == codes.NotFound }
