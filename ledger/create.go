package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/projectdavid/toolsidecar/internal/retry"
)

// Codes of JetStream's answers that a cluster gives while it settles: a
// peer not yet seen online after a start or a restart (no suitable peers
// for placement), or no meta leader for a moment.
const (
	codeClusterNoPeers  jetstream.ErrorCode = 10005
	codeClusterNotAvail jetstream.ErrorCode = 10008
)

// settling reports whether err is one of those answers, or a request that
// timed out while the cluster elected its leader.
func settling(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == codeClusterNoPeers || apiErr.ErrorCode == codeClusterNotAvail
	}
	return errors.Is(err, nats.ErrTimeout)
}

// create makes a JetStream object (a bucket, a stream), trying again while
// the cluster settles, until ctx ends: a sidecar that starts beside a node
// that restarts waits for it instead of failing to start.
func create[T any](ctx context.Context, make func(context.Context) (T, error)) (T, error) {
	var last error
	v, err := backoff.Retry(ctx, func() (T, error) {
		v, err := make(ctx)
		if err != nil && !settling(err) {
			return v, backoff.Permanent(err)
		}
		last = err
		return v, err
	}, backoff.WithBackOff(retry.LedgerOpen.New()), backoff.WithMaxElapsedTime(0))
	if err != nil && ctx.Err() != nil && last != nil && !errors.Is(err, last) {
		err = fmt.Errorf("%w (the cluster was still settling: %w)", err, last)
	}
	return v, err
}
