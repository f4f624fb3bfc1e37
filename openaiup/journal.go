package openaiup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/sizedcache"
)

// A run of an OpenAI-compatible application is journaled so that the
// application's retry resumes it rather than starting another: each
// delivered turn (its assistant message as the upstream will see it
// replayed, its text and usage), each call's output once known, the start
// of each unsafe call before it is sent, and the run's end. Durable mode
// keeps the journal in JetStream (package ledger), where it outlives the
// sidecar; otherwise it is in memory, where it serves a retry that comes
// while the first request still runs, and a finished run's key.
//
// The writes are ordered so that a crash anywhere resumes correctly:
//   - a turn is journaled when its finish chunk came, while its calls
//     run; its unsafe calls (handed over at the finish chunk) start, the
//     next turn is asked and the answer ends only once the write is over:
//     a resumed run never asks a delivered turn again, and an unsafe call
//     is never part of a turn the journal does not hold;
//   - an unsafe call's start is journaled before it is sent (as Core's
//     Action goes processing): one without it was never sent, and runs;
//     one with it is recovered from the ledger's captured reply, or gets
//     the interrupted outcome;
//   - a turn's outputs ride with the next turn's record, or are written
//     as one record when the run ends without one: a delivered turn that
//     is not the last always has them. A resumed run whose last turn lacks
//     some finds the workers' replies in the ledger, where each was
//     captured as it came, and runs again only a call whose reply was lost
//     (never an unsafe one: it gets the interrupted outcome);
//   - the end comes last: a run with one answers from the journal. A run
//     without the application's key then leaves its request's index, so
//     that the next identical request reads no ended run there.

// Journal stores the records of runs, with their revisions for the
// compare-and-set that claims a run. Keys hold letters, digits, '.', '-'
// and '_'. A record lives for the journal's TTL.
type Journal interface {
	// Get returns a record and its revision; a missing one is nil, 0, nil.
	Get(ctx context.Context, key string) ([]byte, uint64, error)
	// Create writes a record that must not exist (ErrJournalExists).
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	// Update rewrites a record at its revision (ErrJournalChanged).
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
	// Put writes a record, whatever was there.
	Put(ctx context.Context, key string, value []byte) error
}

// Errors of a Journal.
var (
	ErrJournalExists  = errors.New("openaiup: the journal record exists")
	ErrJournalChanged = errors.New("openaiup: the journal record changed")
)

// journalTimeout bounds one journal write or read: a journal that does not
// answer must not hold a run past it.
const journalTimeout = 5 * time.Second

// header is a run's first record.
type header struct {
	// Request digests the caller and the whole request: the same key with
	// another request is refused.
	Request string `json:"request"`
	Created int64  `json:"created"`
	// Claims counts the requests that took the run over after a crash
	// (a run without the application's key); the compare-and-set on it
	// makes one of two identical retries the one that resumes it.
	Claims int `json:"claims"`
}

// turnRecord is a delivered turn.
type turnRecord struct {
	Content string `json:"content"`
	Usage   Usage  `json:"usage"`
	Model   string `json:"model,omitempty"`
	Created int64  `json:"created,omitempty"`
	Finish  string `json:"finish,omitempty"`
	// Failed is the upstream's error event, which ended the run.
	Failed string `json:"failed,omitempty"`
	// Assistant is the assistant message with every call, as the next
	// turn replays it; absent when the turn made no call.
	Assistant json.RawMessage `json:"assistant,omitempty"`
	// Calls are the sidecar's calls of the turn, in order; AppCalls the
	// application's.
	Calls    []journaledCall `json:"calls,omitempty"`
	AppCalls []toolCall      `json:"app_calls,omitempty"`
	// Previous are the outputs of the turn before, by action id: they are
	// written with this record rather than on their own.
	Previous map[string]string `json:"previous,omitempty"`
	// Handed are the calls a failed turn had handed over: the turn is
	// asked for again on a retry, and a call it makes again (same tool,
	// same arguments) takes the output journaled for it instead of running.
	Handed []journaledCall `json:"handed,omitempty"`
}

// journaledCall is a call of the sidecar's: the id the assistant message
// gives it, and the executor's call.
type journaledCall struct {
	MessageID  string          `json:"message_id"`
	ActionID   string          `json:"action_id"`
	ToolCallID string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Args       json.RawMessage `json:"args"`
	Problem    string          `json:"problem,omitempty"`
}

// endRecord is how a run ended, for a retry with the application's key.
type endRecord struct {
	Summary executor.Summary `json:"summary"`
}

func headerKey(runID string) string         { return "run." + runID }
func turnKey(runID string, n int) string    { return fmt.Sprintf("turn.%s.%d", runID, n) }
func outputsKey(runID string, n int) string { return fmt.Sprintf("outs.%s.%d", runID, n) }
func startKey(actionID string) string       { return "start." + actionID }
func endKey(runID string) string            { return "end." + runID }
func indexKey(digest string) string         { return "key." + digest }
func digestOf(parts ...[]byte) string       { return hex.EncodeToString(digestBytes(parts...)) }
func shortDigest(parts ...[]byte) string    { return hex.EncodeToString(digestBytes(parts...)[:15]) }
func journalCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), journalTimeout)
}

// digestBytes hashes parts, each length-prefixed so that no two lists of
// parts hash alike.
func digestBytes(parts ...[]byte) []byte {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return h.Sum(nil)
}

// getJSON reads a record into v; found is false for a missing one.
func getJSON(ctx context.Context, j Journal, key string, v any) (rev uint64, found bool, err error) {
	data, rev, err := j.Get(ctx, key)
	if err != nil || data == nil {
		return 0, false, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return 0, false, fmt.Errorf("openaiup: journal record %s: %w", key, err)
	}
	return rev, true, nil
}

// journaled is what the journal holds of a run.
type journaled struct {
	header    header
	headerRev uint64
	found     bool // a header exists
	turns     []turnRecord
	outputs   map[string]string // by action id
	started   map[string]bool   // unsafe calls' starts, by action id
	end       *endRecord
}

// readJournal reads a run's records: its header, its turns in order, the
// outputs and starts of the last turn's calls and of every earlier one,
// and its end.
func readJournal(ctx context.Context, j Journal, runID string) (*journaled, error) {
	ctx, cancel := journalCtx(ctx)
	defer cancel()
	jr := &journaled{outputs: map[string]string{}, started: map[string]bool{}}
	var err error
	if jr.headerRev, jr.found, err = getJSON(ctx, j, headerKey(runID), &jr.header); err != nil || !jr.found {
		return jr, err
	}
	for n := 1; ; n++ {
		var t turnRecord
		_, ok, err := getJSON(ctx, j, turnKey(runID, n), &t)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		jr.turns = append(jr.turns, t)
	}
	for n, t := range jr.turns {
		// A turn's outputs ride with the next turn's record, or, when no
		// turn followed, are a record of their own.
		outs := map[string]string{}
		if n+1 < len(jr.turns) {
			outs = jr.turns[n+1].Previous
		}
		calls := slices.Concat(t.Calls, t.Handed)
		if slices.ContainsFunc(calls, func(c journaledCall) bool { _, ok := outs[c.ActionID]; return !ok }) {
			alone := map[string]string{}
			if _, _, err := getJSON(ctx, j, outputsKey(runID, n+1), &alone); err != nil {
				return nil, err
			}
			maps.Copy(alone, outs)
			outs = alone
		}
		for _, c := range calls {
			if out, ok := outs[c.ActionID]; ok {
				jr.outputs[c.ActionID] = out
				continue
			}
			mark, _, err := j.Get(ctx, startKey(c.ActionID))
			if err != nil {
				return nil, err
			}
			jr.started[c.ActionID] = mark != nil
		}
	}
	var end endRecord
	if _, ok, err := getJSON(ctx, j, endKey(runID), &end); err != nil {
		return nil, err
	} else if ok {
		jr.end = &end
	}
	return jr, nil
}

// runKey names the run a request belongs to.
type runKey struct {
	// explicit: the application sent Idempotency-Key; the run id is
	// derived from it and the caller.
	explicit bool
	id       string // the run id, when explicit
	digest   string // of the caller and the whole request
}

// maxIdempotencyKey bounds the Idempotency-Key header, as other APIs do
// (Stripe: 255 characters).
const maxIdempotencyKey = 255

// keyOf derives the run key of a request: from the application's
// Idempotency-Key, or from a digest of the caller's identity and the whole
// request (model, messages, tools, metadata and every setting), given as
// canonical JSON.
func keyOf(r *http.Request, a api, canonical []byte) (runKey, error) {
	caller := []byte(r.Header.Get("Authorization"))
	if k := r.Header.Get("X-Api-Key"); k != "" { // the Messages API's key
		caller = fmt.Appendf(caller, "\x00x-api-key:%s", k)
	}
	k := runKey{digest: digestOf([]byte("request"), caller, canonical)}
	idem := r.Header.Get("Idempotency-Key")
	if idem == "" {
		return k, nil
	}
	if len(idem) > maxIdempotencyKey {
		return k, &badRequest{msg: fmt.Sprintf("the Idempotency-Key header is longer than %d characters", maxIdempotencyKey)}
	}
	for _, c := range []byte(idem) {
		if c < 0x21 || c > 0x7e {
			return k, &badRequest{msg: "the Idempotency-Key header holds a character that is not printable ASCII"}
		}
	}
	k.explicit, k.id = true, a.runPrefix()+shortDigest([]byte("idempotency-key"), caller, []byte(idem))
	return k, nil
}

// actionID is a call's identity in the run: derived from the run, the
// turn, the id the model gave it (or its position when it gave none) and
// what it asks, so that it is the same on every retry of the run (the
// worker's Tool-Idempotency-Key, the ledger's key), and a call the model
// makes differently when a turn is asked again is another call.
func actionID(runID string, turn, pos int, modelID, tool, args string) string {
	return "act-" + shortDigest([]byte(runID), fmt.Appendf(nil, "%d/%d", turn, pos), []byte(modelID), []byte(tool), []byte(args))
}

// memJournal is a Journal in memory: records live for the TTL, and the
// oldest are dropped first once they hold more than maxBytes.
type memJournal struct {
	ttl time.Duration

	mu      sync.Mutex
	records *sizedcache.Cache[memRecord]
	rev     uint64
}

type memRecord struct {
	value []byte
	rev   uint64
}

// NewMemoryJournal is a Journal in memory, for a sidecar without durable
// mode: it serves retries that reach this process while it lives.
func NewMemoryJournal(ttl time.Duration, maxBytes int) Journal {
	return &memJournal{ttl: ttl, records: sizedcache.New(maxBytes, func(r memRecord) int { return len(r.value) })}
}

func (m *memJournal) Get(_ context.Context, key string) ([]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.records.Get(key)
	if !ok {
		return nil, 0, nil
	}
	return r.value, r.rev, nil
}

func (m *memJournal) Create(_ context.Context, key string, value []byte) (uint64, error) {
	return m.write(key, value, func(_ memRecord, found bool) error {
		if found {
			return ErrJournalExists
		}
		return nil
	})
}

func (m *memJournal) Update(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return m.write(key, value, func(cur memRecord, found bool) error {
		if !found || cur.rev != rev {
			return ErrJournalChanged
		}
		return nil
	})
}

func (m *memJournal) Put(_ context.Context, key string, value []byte) error {
	_, err := m.write(key, value, func(memRecord, bool) error { return nil })
	return err
}

// write stores value under key when check allows it.
func (m *memJournal) write(key string, value []byte, check func(cur memRecord, found bool) error) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := check(m.records.Get(key)); err != nil {
		return 0, err
	}
	m.rev++
	m.records.Put(key, memRecord{value, m.rev}, time.Now().Add(m.ttl))
	return m.rev, nil
}

// runIndex lists the runs begun under one request digest (runs without the
// application's key), newest last, so that a retry finds the one a crash
// interrupted.
type runIndex struct {
	Runs []string `json:"runs"`
}

// maxIndexed bounds the runs an index keeps: identical requests in flight
// at once beyond it are not resumed after a crash (they run again).
const maxIndexed = 16

// index adds runID to the runs of digest, with a compare-and-set so that
// concurrent runs are all kept.
func index(ctx context.Context, j Journal, digest, runID string) error {
	return changeIndex(ctx, j, digest, runID, func(runs []string) []string {
		runs = append(runs, runID)
		return runs[max(0, len(runs)-maxIndexed):]
	})
}

// unindex removes an ended run from the runs of digest: a retry of the
// same request then reads no run that it would only find ended.
func unindex(ctx context.Context, j Journal, digest, runID string) error {
	return changeIndex(ctx, j, digest, runID, func(runs []string) []string {
		return slices.DeleteFunc(runs, func(id string) bool { return id == runID })
	})
}

// changeIndex rewrites the runs of digest with change, retrying the
// compare-and-set while concurrent runs change them too.
func changeIndex(ctx context.Context, j Journal, digest, runID string, change func([]string) []string) error {
	for range 8 {
		var ix runIndex
		rev, found, err := getJSON(ctx, j, indexKey(digest), &ix)
		if err != nil {
			return err
		}
		n := len(ix.Runs)
		ix.Runs = change(ix.Runs)
		if len(ix.Runs) == n && !slices.Contains(ix.Runs, runID) {
			return nil // nothing to remove
		}
		data, _ := json.Marshal(ix)
		if found {
			_, err = j.Update(ctx, indexKey(digest), data, rev)
		} else {
			_, err = j.Create(ctx, indexKey(digest), data)
		}
		if !errors.Is(err, ErrJournalChanged) && !errors.Is(err, ErrJournalExists) {
			return err
		}
	}
	return fmt.Errorf("openaiup: the run index of a request changed 8 times while run %s was written in it", runID)
}

// journaledOf is a call as the journal keeps it.
func journaledOf(messageID string, c *executor.ToolCall) journaledCall {
	return journaledCall{MessageID: messageID, ActionID: c.ActionID, ToolCallID: c.ToolCallID, Tool: c.Tool, Args: c.Args, Problem: c.Problem}
}

// call is the executor's call.
func (c journaledCall) call(runID string) *executor.ToolCall {
	return &executor.ToolCall{RunID: runID, ActionID: c.ActionID, ToolCallID: c.ToolCallID, Tool: c.Tool, Args: c.Args, Problem: c.Problem}
}
