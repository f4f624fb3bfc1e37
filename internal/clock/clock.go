// Package clock holds the one context-aware wait of the sidecar's own code.
// Package core keeps a copy of its own: it imports no project package.
package clock

import (
	"context"
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
