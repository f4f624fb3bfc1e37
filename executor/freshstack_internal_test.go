package executor

import (
	"errors"
	"testing"
)

// TestOnFreshStackRaisesPanics: a panic while a stream is read reaches the
// drive's goroutine as it did before the stream had a goroutine of its own,
// and f has returned when onFreshStack does.
func TestOnFreshStackRaisesPanics(t *testing.T) {
	ran := false
	onFreshStack(func() { ran = true })
	if !ran {
		t.Fatal("onFreshStack returned before f ran")
	}
	boom := errors.New("boom")
	defer func() {
		if p := recover(); p != boom {
			t.Fatalf("recovered %v, want f's panic value", p)
		}
	}()
	onFreshStack(func() { panic(boom) })
	t.Fatal("onFreshStack returned after f panicked")
}
