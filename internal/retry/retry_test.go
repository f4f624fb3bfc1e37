package retry

import (
	"testing"
	"time"
)

// TestPolicies: every policy has a name of its own, and the waits of a
// fresh backoff start within the first wait's jitter and never pass the
// cap's.
func TestPolicies(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range []Policy{CoreCall, CoreWrite, UpstreamTurn, Attempt, Lease, LedgerOpen, NATSConnect} {
		if p.Name == "" || seen[p.Name] {
			t.Errorf("policy %+v: name empty or taken", p)
		}
		seen[p.Name] = true
		for range 20 {
			b := p.New()
			lo, hi := time.Duration(float64(p.First)*(1-p.Jitter)), time.Duration(float64(p.First)*(1+p.Jitter))
			if w := b.NextBackOff(); w < lo || w > hi {
				t.Errorf("%s: first wait %v, want %v to %v", p.Name, w, lo, hi)
			}
			for range 30 {
				if w := b.NextBackOff(); w <= 0 || w > time.Duration(float64(p.Max)*(1+p.Jitter)) {
					t.Errorf("%s: wait %v past the cap %v", p.Name, w, p.Max)
				}
			}
		}
	}
}
