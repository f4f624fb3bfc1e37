package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestCreateWaitsForTheCluster: while JetStream answers that no peer is
// available for placement (a cluster whose node is not yet seen online),
// the creation is tried again; another refusal is returned at once; and a
// cluster that never settles ends with the context, naming why.
func TestCreateWaitsForTheCluster(t *testing.T) {
	noPeers := &jetstream.APIError{Code: 400, ErrorCode: codeClusterNoPeers, Description: "no suitable peers for placement, peer offline"}
	tries := 0
	got, err := create(context.Background(), func(context.Context) (string, error) {
		if tries++; tries < 3 {
			return "", noPeers
		}
		return "bucket", nil
	})
	if err != nil || got != "bucket" || tries != 3 {
		t.Errorf("got %q %v after %d tries, want the bucket after 3", got, err, tries)
	}
	bad := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeBadRequest, Description: "bad request"}
	tries = 0
	if _, err := create(context.Background(), func(context.Context) (string, error) { tries++; return "", bad }); !errors.Is(err, bad) || tries != 1 {
		t.Errorf("a bad request: %v after %d tries, want it at once", err, tries)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = create(ctx, func(context.Context) (string, error) { return "", noPeers })
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, noPeers) {
		t.Errorf("a cluster that never settles: %v, want the deadline and the last refusal", err)
	}
}
