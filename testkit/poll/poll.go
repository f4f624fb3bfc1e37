// Package poll waits in tests for a condition that another process or
// goroutine makes true, without a fixed sleep. It is for tests only.
package poll

import (
	"testing"
	"time"
)

// Timeout is how long Until waits: long, since a loaded CI machine is slow,
// and a passing test never waits for it.
const Timeout = 15 * time.Second

// Until checks cond every 10ms until it holds, and fails the test naming
// what it waited for when Timeout passes first.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", Timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
