package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/tool"
)

// Approvals is the ledger's approval store: one KV entry per Action, whose
// verdict is written once, by a compare-and-set on the entry's revision,
// so that of two sidecars deciding at once one wins and the other gets
// approval.ErrDecided. Entries expire with the ledger.
type Approvals struct{ kv jetstream.KeyValue }

// Approvals returns the ledger's approval store.
func (l *Ledger) Approvals() *Approvals { return &Approvals{kv: l.approvals} }

var _ approval.Store = (*Approvals)(nil)

// Durable reports that the approvals outlive the process (approval.Outlives).
func (*Approvals) Durable() bool { return true }

// Open implements approval.Store.
func (a *Approvals) Open(ctx context.Context, r approval.Request) (approval.Entry, error) {
	if err := tool.CheckID("action_id", r.ActionID); err != nil {
		return approval.Entry{}, fmt.Errorf("ledger: %w", err)
	}
	data, err := json.Marshal(approval.Entry{Request: r})
	if err != nil {
		return approval.Entry{}, err
	}
	_, err = a.kv.Create(ctx, r.ActionID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, _, err := a.get(ctx, r.ActionID)
		return e, err
	}
	if err != nil {
		return approval.Entry{}, fmt.Errorf("ledger: recording the approval of %s: %w", r.ActionID, err)
	}
	return approval.Entry{Request: r}, nil
}

// Get implements approval.Store.
func (a *Approvals) Get(ctx context.Context, actionID string) (approval.Entry, error) {
	e, _, err := a.get(ctx, actionID)
	return e, err
}

// get reads an approval and its revision.
func (a *Approvals) get(ctx context.Context, actionID string) (approval.Entry, uint64, error) {
	if tool.CheckID("action_id", actionID) != nil {
		return approval.Entry{}, 0, approval.ErrNotFound // no such key can exist
	}
	kve, err := a.kv.Get(ctx, actionID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return approval.Entry{}, 0, approval.ErrNotFound
	}
	if err != nil {
		return approval.Entry{}, 0, fmt.Errorf("ledger: reading the approval of %s: %w", actionID, err)
	}
	e, err := decodeApproval(kve)
	return e, kve.Revision(), err
}

func decodeApproval(kve jetstream.KeyValueEntry) (approval.Entry, error) {
	var e approval.Entry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return e, fmt.Errorf("ledger: approval %s: %w", kve.Key(), err)
	}
	return e, nil
}

// Await implements approval.Store: it watches the entry until a verdict is
// written, by this sidecar or another.
func (a *Approvals) Await(ctx context.Context, actionID string) (approval.Verdict, error) {
	if err := tool.CheckID("action_id", actionID); err != nil {
		return approval.Verdict{}, fmt.Errorf("ledger: %w", err)
	}
	w, err := a.kv.Watch(ctx, actionID)
	if err != nil {
		return approval.Verdict{}, fmt.Errorf("ledger: watching the approval of %s: %w", actionID, err)
	}
	defer w.Stop()
	for {
		select {
		case kve := <-w.Updates():
			if kve == nil || kve.Operation() != jetstream.KeyValuePut {
				continue // the end of the initial values, or a purge
			}
			e, err := decodeApproval(kve)
			if err != nil {
				return approval.Verdict{}, err
			}
			if e.Verdict != nil {
				return *e.Verdict, nil
			}
		case <-ctx.Done():
			return approval.Verdict{}, context.Cause(ctx)
		}
	}
}

// Decide implements approval.Store.
func (a *Approvals) Decide(ctx context.Context, actionID string, v approval.Verdict) (approval.Entry, error) {
	for {
		e, rev, err := a.get(ctx, actionID)
		if err != nil {
			return e, err
		}
		if e.Verdict != nil {
			return e, approval.ErrDecided
		}
		e.Verdict = &v
		data, err := json.Marshal(e)
		if err != nil {
			return e, err
		}
		_, err = a.kv.Update(ctx, actionID, data, rev)
		if err == nil {
			return e, nil
		}
		if !isWrongLastSeq(err) {
			return e, fmt.Errorf("ledger: deciding the approval of %s: %w", actionID, err)
		}
		// Written meanwhile: read it again (decided by someone else, most
		// likely).
	}
}

// Pending implements approval.Store.
func (a *Approvals) Pending(ctx context.Context) ([]approval.Entry, error) {
	w, err := a.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("ledger: listing approvals: %w", err)
	}
	defer w.Stop()
	out := []approval.Entry{}
	for {
		select {
		case kve := <-w.Updates():
			if kve == nil { // every current value has been read
				approval.SortOldestFirst(out)
				return out, nil
			}
			if e, err := decodeApproval(kve); err == nil && e.Verdict == nil {
				out = append(out, e)
			}
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}
