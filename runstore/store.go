// Package runstore is the journal of the runs the sidecar answers on a
// model's API (package openaiup): the records a retried request reads to
// resume its run rather than start another. A run has a header (what was
// asked, when, and how often a crash's survivor claimed it), a record per
// delivered turn, the outputs of its calls, a mark for each unsafe call
// started, and an end. Runs begun without the application's
// Idempotency-Key are listed in an index of their request, where a retry
// of the same request finds the one a crash interrupted.
//
// The records are JSON under these keys; records written by earlier
// sidecars must read the same, so neither changes:
//
//	run.<run>         Header
//	turn.<run>.<n>    Turn, n from 1
//	outs.<run>.<n>    the outputs of turn n that no later turn carries
//	start.<action>    1: the unsafe call started
//	answer.<action>   Answer: a hosted session's call, the result chosen
//	                  to post (package agentsup)
//	end.<run>         End
//	key.<digest>      the index of a request: {"runs": [...]}
//
// What records carry of the model's API (usage, the application's calls)
// and of the loop (a run's summary) is kept as the JSON its owner wrote:
// the store, and the ledger that holds its durable journal, know neither.
package runstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Header is a run's first record.
type Header struct {
	// Request digests the caller and the whole request: the same key with
	// another request is refused.
	Request string `json:"request"`
	// Created is when the run began, in Unix seconds.
	Created int64 `json:"created"`
	// Claims counts the requests that took the run over after a crash
	// (a run without the application's key); the compare-and-set on it
	// makes one of two identical retries the one that resumes it.
	Claims int `json:"claims"`
}

// Turn is a delivered turn.
type Turn struct {
	Content string `json:"content"`
	// Usage is the turn's usage as the model API's adapter writes it.
	Usage   json.RawMessage `json:"usage"`
	Model   string          `json:"model,omitempty"`
	Created int64           `json:"created,omitempty"`
	Finish  string          `json:"finish,omitempty"`
	// Failed is the upstream's error event, which ended the run.
	Failed string `json:"failed,omitempty"`
	// Assistant is the assistant message with every call, as the next
	// turn replays it; absent when the turn made no call.
	Assistant json.RawMessage `json:"assistant,omitempty"`
	// Calls are the sidecar's calls of the turn, in order.
	Calls []Call `json:"calls,omitempty"`
	// AppCalls are the application's calls of the turn, as the adapter
	// writes them; absent when it made none.
	AppCalls json.RawMessage `json:"app_calls,omitempty"`
	// Previous are the outputs of the turn before, by action id: they are
	// written with this record rather than on their own.
	Previous map[string]string `json:"previous,omitempty"`
	// Handed are the calls a failed turn had handed over: the turn is
	// asked for again on a retry, and a call it makes again (same tool,
	// same arguments) takes the output journaled for it instead of running.
	Handed []Call `json:"handed,omitempty"`
}

// Call is a call of the sidecar's: the id the assistant message gives it,
// and the executor's call.
type Call struct {
	MessageID  string          `json:"message_id"`
	ActionID   string          `json:"action_id"`
	ToolCallID string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Args       json.RawMessage `json:"args"`
	Problem    string          `json:"problem,omitempty"`
}

// End is how a run ended, for a retry with the application's key.
type End struct {
	// Summary is the drive's summary as the loop writes it.
	Summary json.RawMessage `json:"summary"`
}

// Run is what the journal holds of a run.
type Run struct {
	Header Header
	// Turns are the delivered turns, in order.
	Turns []Turn
	// Outputs are the outputs of every turn's calls, by action id.
	Outputs map[string]string
	// Started says, for each call without an output, whether its start
	// was marked, by action id.
	Started map[string]bool
	// End is nil while the run has not ended.
	End *End
}

// index lists the runs begun under one request digest (runs without the
// application's key), newest last.
type index struct {
	Runs []string `json:"runs"`
}

func headerKey(runID string) string         { return "run." + runID }
func turnKey(runID string, n int) string    { return fmt.Sprintf("turn.%s.%d", runID, n) }
func outputsKey(runID string, n int) string { return fmt.Sprintf("outs.%s.%d", runID, n) }
func startKey(actionID string) string       { return "start." + actionID }
func answerKey(actionID string) string      { return "answer." + actionID }
func endKey(runID string) string            { return "end." + runID }
func indexKey(digest string) string         { return "key." + digest }

// Store reads and writes the records of runs in a Journal. Its methods
// are bounded by ctx alone: a caller bounds a step of several of them
// with [Bound].
type Store struct{ j Journal }

// New is the store of the runs in j. No I/O.
func New(j Journal) *Store { return &Store{j: j} }

// getJSON reads a record into v; found is false for a missing one.
func (s *Store) getJSON(ctx context.Context, key string, v any) (rev uint64, found bool, err error) {
	data, rev, err := s.j.Get(ctx, key)
	if err != nil || data == nil {
		return 0, false, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return 0, false, fmt.Errorf("runstore: journal record %s: %w", key, err)
	}
	return rev, true, nil
}

// putJSON writes v as the record under key.
func (s *Store) putJSON(ctx context.Context, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.j.Put(ctx, key, data)
}

// Header reads a run's header; false when the journal has none.
func (s *Store) Header(ctx context.Context, runID string) (Header, bool, error) {
	var h Header
	_, found, err := s.getJSON(ctx, headerKey(runID), &h)
	return h, found, err
}

// WriteHeader writes a run's header, unless it has one.
func (s *Store) WriteHeader(ctx context.Context, runID string, h Header) error {
	data, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if _, err := s.j.Create(ctx, headerKey(runID), data); err != nil && !errors.Is(err, ErrExists) {
		return err
	}
	return nil
}

// Claim takes over a run that a crash interrupted: it counts a claim in
// the run's header with a compare-and-set, so that of the claimers that
// read the header at one revision exactly one wins (true). It returns the
// header; false when the run has none or another claim came first. That
// the run did not end, and that no one drives it, is the caller's to know.
func (s *Store) Claim(ctx context.Context, runID string) (Header, bool, error) {
	var h Header
	rev, found, err := s.getJSON(ctx, headerKey(runID), &h)
	if err != nil || !found {
		return h, false, err
	}
	h.Claims++
	data, err := json.Marshal(h)
	if err != nil {
		return h, false, err
	}
	if _, err := s.j.Update(ctx, headerKey(runID), data, rev); errors.Is(err, ErrChanged) {
		return h, false, nil
	} else if err != nil {
		return h, false, err
	}
	return h, true, nil
}

// WriteTurn writes turn n (from 1) of a run.
func (s *Store) WriteTurn(ctx context.Context, runID string, n int, t Turn) error {
	return s.putJSON(ctx, turnKey(runID, n), t)
}

// WriteOutputs writes outputs of turn n by action id, as a record of their
// own: those that no later turn's record carries (Turn.Previous).
func (s *Store) WriteOutputs(ctx context.Context, runID string, n int, outs map[string]string) error {
	return s.putJSON(ctx, outputsKey(runID, n), outs)
}

// MarkStarted marks an unsafe call as started, before it is sent: a call
// without the mark never was.
func (s *Store) MarkStarted(ctx context.Context, actionID string) error {
	return s.j.Put(ctx, startKey(actionID), []byte("1"))
}

// Started reports an unsafe call whose start is marked.
func (s *Store) Started(ctx context.Context, actionID string) (bool, error) {
	data, _, err := s.j.Get(ctx, startKey(actionID))
	return data != nil, err
}

// Answer is the result chosen for a call of a hosted session, written
// before it is posted: a post after a crash sends this one, never
// another.
type Answer struct {
	OK     bool   `json:"ok"`
	Output string `json:"output"`
}

// WriteAnswer writes a call's answer, unless one is written already; it
// returns the answer that stands, and whether it is this one (first).
func (s *Store) WriteAnswer(ctx context.Context, actionID string, a Answer) (stands Answer, first bool, err error) {
	data, err := json.Marshal(a)
	if err != nil {
		return a, false, err
	}
	if _, err := s.j.Create(ctx, answerKey(actionID), data); errors.Is(err, ErrExists) {
		prev, err := s.Answer(ctx, actionID)
		if err != nil || prev == nil {
			return a, false, fmt.Errorf("runstore: the answer of %s exists, but could not be read: %v", actionID, err)
		}
		return *prev, false, nil
	} else if err != nil {
		return a, false, err
	}
	return a, true, nil
}

// Answer reads a call's answer; nil when none is written.
func (s *Store) Answer(ctx context.Context, actionID string) (*Answer, error) {
	var a Answer
	if _, found, err := s.getJSON(ctx, answerKey(actionID), &a); err != nil || !found {
		return nil, err
	}
	return &a, nil
}

// WriteEnd writes how a run ended.
func (s *Store) WriteEnd(ctx context.Context, runID string, e End) error {
	return s.putJSON(ctx, endKey(runID), e)
}

// End reads how a run ended; nil while it has not.
func (s *Store) End(ctx context.Context, runID string) (*End, error) {
	var e End
	if _, found, err := s.getJSON(ctx, endKey(runID), &e); err != nil || !found {
		return nil, err
	}
	return &e, nil
}

// Ended reports a run that has an end, without reading it: the commonest
// run in an index is ruled out by one read.
func (s *Store) Ended(ctx context.Context, runID string) (bool, error) {
	data, _, err := s.j.Get(ctx, endKey(runID))
	return data != nil, err
}

// Read reads a whole run: its header, its turns in order, the outputs and
// start marks of every turn's calls, and its end. A run without a header
// is nil.
func (s *Store) Read(ctx context.Context, runID string) (*Run, error) {
	run := &Run{Outputs: map[string]string{}, Started: map[string]bool{}}
	if _, found, err := s.getJSON(ctx, headerKey(runID), &run.Header); err != nil || !found {
		return nil, err
	}
	for n := 1; ; n++ {
		var t Turn
		if _, found, err := s.getJSON(ctx, turnKey(runID, n), &t); err != nil {
			return nil, err
		} else if !found {
			break
		}
		run.Turns = append(run.Turns, t)
	}
	for n := range run.Turns {
		if err := s.readOutputs(ctx, run, runID, n); err != nil {
			return nil, err
		}
	}
	var err error
	if run.End, err = s.End(ctx, runID); err != nil {
		return nil, err
	}
	return run, nil
}

// readOutputs adds to run the outputs of the calls of its turn at index
// n, and the start marks of those without one.
func (s *Store) readOutputs(ctx context.Context, run *Run, runID string, n int) error {
	// A turn's outputs ride with the next turn's record, or, when no turn
	// followed, are a record of their own.
	outs := map[string]string{}
	if n+1 < len(run.Turns) {
		outs = run.Turns[n+1].Previous
	}
	calls := slices.Concat(run.Turns[n].Calls, run.Turns[n].Handed)
	if slices.ContainsFunc(calls, func(c Call) bool { _, ok := outs[c.ActionID]; return !ok }) {
		alone := map[string]string{}
		if _, _, err := s.getJSON(ctx, outputsKey(runID, n+1), &alone); err != nil {
			return err
		}
		maps.Copy(alone, outs)
		outs = alone
	}
	for _, c := range calls {
		if out, ok := outs[c.ActionID]; ok {
			run.Outputs[c.ActionID] = out
			continue
		}
		mark, _, err := s.j.Get(ctx, startKey(c.ActionID))
		if err != nil {
			return err
		}
		run.Started[c.ActionID] = mark != nil
	}
	return nil
}

// maxIndexed bounds the runs an index keeps: identical requests in flight
// at once beyond it are not resumed after a crash (they run again).
const maxIndexed = 16

// Runs lists the runs of a request digest that the index holds, newest
// last.
func (s *Store) Runs(ctx context.Context, digest string) ([]string, error) {
	var ix index
	_, _, err := s.getJSON(ctx, indexKey(digest), &ix)
	return ix.Runs, err
}

// Index adds a run to the runs of its request digest, with a
// compare-and-set so that concurrent runs are all kept. The index keeps
// the newest 16.
func (s *Store) Index(ctx context.Context, digest, runID string) error {
	return s.changeIndex(ctx, digest, runID, true)
}

// Unindex removes an ended run from the runs of its request digest: a
// retry of the same request then reads no run that it would only find
// ended. An index that does not list the run is not written.
func (s *Store) Unindex(ctx context.Context, digest, runID string) error {
	return s.changeIndex(ctx, digest, runID, false)
}

// changeIndex adds runID to the runs of digest, or removes it, retrying
// the compare-and-set while concurrent runs change them too.
func (s *Store) changeIndex(ctx context.Context, digest, runID string, add bool) error {
	for range 8 {
		var ix index
		rev, found, err := s.getJSON(ctx, indexKey(digest), &ix)
		if err != nil {
			return err
		}
		if add {
			ix.Runs = append(ix.Runs, runID)
			ix.Runs = ix.Runs[max(0, len(ix.Runs)-maxIndexed):]
		} else {
			n := len(ix.Runs)
			ix.Runs = slices.DeleteFunc(ix.Runs, func(id string) bool { return id == runID })
			if len(ix.Runs) == n {
				return nil // nothing to remove
			}
		}
		data, _ := json.Marshal(ix)
		if found {
			_, err = s.j.Update(ctx, indexKey(digest), data, rev)
		} else {
			_, err = s.j.Create(ctx, indexKey(digest), data)
		}
		if !errors.Is(err, ErrChanged) && !errors.Is(err, ErrExists) {
			return err
		}
	}
	return fmt.Errorf("runstore: the run index of a request changed 8 times while run %s was written in it", runID)
}
