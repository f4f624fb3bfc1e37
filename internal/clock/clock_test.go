package clock

import (
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for h, want := range map[string]time.Duration{
		"":                              0,
		"3":                             3 * time.Second,
		"-4":                            0,
		"3600":                          time.Minute, // bounded
		"Fri, 04 Dec 2026 12:00:20 GMT": 20 * time.Second,
		"Fri, 04 Dec 2026 11:00:00 GMT": 0, // in the past
		"soon":                          0,
	} {
		if got := RetryAfter(h, now); got != want {
			t.Errorf("RetryAfter(%q) = %v, want %v", h, got, want)
		}
	}
}
