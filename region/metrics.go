package region

import "time"

// Metrics receives what a region counts for its operators. The region exports nothing
// itself: the process's wiring (cmd/internal/cluster) turns these calls into Prometheus
// metrics, and Config's default discards them. Methods are called on the request's or the
// writer's goroutine, so they must be cheap and safe for concurrent use.
type Metrics interface {
	// Reserved is one Reserve's answer: err nil for a hold (a replayed one too), else the
	// refusal (sold out, exhausted, over the limit, ...).
	Reserved(err error)
	// BatchCommitted is one batch the writer committed: its operations, and how long it took
	// from applying the first of them to the commit's answer.
	BatchCommitted(ops int, took time.Duration)
	// Fenced is one write a fence refused (I4): FenceEpoch or FenceGeneration.
	Fenced(fence string)
}

// The fences Metrics.Fenced names.
const (
	// FenceEpoch: a batch of a leader whose epoch a newer leader has raised; it commits
	// nothing.
	FenceEpoch = "epoch"
	// FenceGeneration: a coordinator's request under a generation below the sale's highest
	// seen.
	FenceGeneration = "generation"
)

// noMetrics is Config.Metrics's default: it counts nothing.
type noMetrics struct{}

func (noMetrics) Reserved(error)                    {}
func (noMetrics) BatchCommitted(int, time.Duration) {}
func (noMetrics) Fenced(string)                     {}
