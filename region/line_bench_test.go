package region_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/internal/testpg"
	"github.com/quotaworks/quota/region"
	"github.com/quotaworks/quota/transfer"
)

// BenchmarkEnter is what making the line durable costs an Enter, side by side in one run:
// memory is the waiting room alone (admission.Room.Enter, as the leader kept it before the
// line was written), durable the front door's Enter, which answers once the entry's row is
// committed (line.go), with 64 buyers entering at once so that their rows share batches, and
// with 1,024. Each Enter is a new buyer. Enters/s is reported as enters/s.
func BenchmarkEnter(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		room, err := admission.NewRoom(admission.RoomConfig{Sale: "bench", Region: "us", OpensAt: t0, Rate: 1000, MaxLive: 1000,
			TicketTTL: time.Minute, MaxQueue: 10_000_000})
		if err != nil {
			b.Fatal(err)
		}
		var n atomic.Int64
		b.SetParallelism(32)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := room.Enter(fmt.Sprintf("u%d", n.Add(1)), t0); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "enters/s")
	})
	b.Run("durable", func(b *testing.B) { benchDurableEnter(b, 32) })
	// The same with 1,024 buyers entering at once: batches grow with the callers waiting.
	b.Run("durable-1024", func(b *testing.B) { benchDurableEnter(b, 512) })
}

// benchDurableEnter runs the front door's durable Enter with parallelism × GOMAXPROCS buyers
// entering at once, each Enter a new buyer.
func benchDurableEnter(b *testing.B, parallelism int) {
	door := benchDoor(b)
	var n atomic.Int64
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := door.Enter(context.Background(), "bench", fmt.Sprintf("u%d", n.Add(1)), ""); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "enters/s")
}

// benchDoor is a leading region's door with a sale "bench" whose room is open and admits no
// one (rate 1 a second, one live ticket), so every Enter joins the line.
func benchDoor(b *testing.B) *region.Door {
	ctx := context.Background()
	pool, _ := testpg.NewPool(b, "linebench", 16)
	if err := region.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	keys, err := admission.ParseKeyring([]byte("k1 " + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32)) + "\n"))
	if err != nil {
		b.Fatal(err)
	}
	r, err := region.New(region.Config{Name: "us", Logger: quietLogger, Sweep: region.SweepConfig{Interval: time.Hour},
		Cluster: region.ClusterView{Tickets: func() *admission.Keyring { return keys }}}, pool)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Close)
	if err := r.Lead(ctx, 1); err != nil {
		b.Fatal(err)
	}
	terms := defaultTerms("bench", 1)
	terms.OpensAt = time.Now().Add(-time.Hour)
	terms.Admission = transfer.AdmissionTerms{Rate: 1, TicketTTL: time.Hour, MaxLive: 1}
	if err := r.PutSale(ctx, 1, terms); err != nil {
		b.Fatal(err)
	}
	if _, err := r.Credit(ctx, region.CreditRequest{Generation: 1, TransferID: "t", Sale: "bench", SKU: testSKU, Units: 1}); err != nil {
		b.Fatal(err)
	}
	d, err := region.NewDoor(r, region.DoorConfig{Keys: func() *admission.Keyring { return keys }, PerUserRate: 1e6, PerUserBurst: 1000,
		MaxBuckets: 10_000_000, MaxQueue: 10_000_000})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Close)
	return d
}
