// Package retry names the backoff policies of the sidecar: each wait
// between two tries of something that may succeed later is one of these,
// so that a policy is read, compared and changed in one place. All are
// exponential (each wait twice the last, jittered), from a first wait to a
// cap; how long to go on is each caller's own bound (a context, a budget,
// a number of tries).
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy is a named exponential backoff.
type Policy struct {
	// Name says what the policy paces.
	Name string
	// First is the first wait; Max caps every wait.
	First, Max time.Duration
	// Jitter is how far a wait may stray from its value, as a fraction of
	// it (1: anywhere from 0 to twice).
	Jitter float64
}

// The policies.
var (
	// CoreCall paces a call to Core that may be repeated (a read, a PUT),
	// within core.timeout: fully jittered, so that the sidecars that a
	// Core restart cut off do not come back together.
	CoreCall = Policy{Name: "core_call", First: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 1}
	// CoreWrite paces the writes that make an outcome count (a tool
	// output, an Action's final status), within the submit budget.
	CoreWrite = Policy{Name: "core_write", First: 200 * time.Millisecond, Max: 10 * time.Second, Jitter: 0.5}
	// UpstreamTurn paces a model API's turn asked again after a 429, a 5xx
	// or a cut stream, within upstream.retry_budget (a Retry-After longer
	// than the wait wins).
	UpstreamTurn = Policy{Name: "upstream_turn", First: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.5}
	// Attempt paces a tool call's next attempt after a timeout, no
	// responders or a retryable worker error, within the tool's retries.
	Attempt = Policy{Name: "attempt", First: 50 * time.Millisecond, Max: time.Second, Jitter: 1}
	// Lease paces taking a run's lease while JetStream refuses it.
	Lease = Policy{Name: "lease", First: 50 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	// LedgerOpen paces creating the ledger's buckets and streams at start,
	// while a cluster settles.
	LedgerOpen = Policy{Name: "ledger_open", First: 100 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	// NATSConnect paces the first connection to NATS, within
	// nats.first_try.
	NATSConnect = Policy{Name: "nats_connect", First: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}
)

// New is a backoff of the policy, ready for its first wait.
func (p Policy) New() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{InitialInterval: p.First, RandomizationFactor: p.Jitter, Multiplier: 2, MaxInterval: p.Max}
	b.Reset()
	return b
}
