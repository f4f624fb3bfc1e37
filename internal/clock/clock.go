// Package clock holds the waits of the sidecar's own code: the one
// context-aware sleep, and the wait an HTTP server asks for (Retry-After).
// It is a leaf: package core may use it.
package clock

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

// Sleep waits for d, or until ctx ends, which it reports as ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// RetryAfter reads a Retry-After header: whole seconds or an HTTP date,
// bounded to a minute so that a wild value cannot stall a batch; 0 when
// the header is absent or unreadable.
func RetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.Atoi(v); err == nil {
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return max(0, min(d, time.Minute))
}
