// Package ledger is the durable memory of the sidecar on NATS JetStream:
// an outcome ledger in a KV bucket, keyed by Action ID, and a stream that
// captures every worker reply. A sidecar that died mid-batch finds, when a
// run is driven again, the reply that arrived while it was away, and
// submits it instead of running the tool again.
//
// Workers need no JetStream knowledge: each request is sent with a reply
// subject in the sidecar's own namespace (<prefix>.replies.<instance>.
// <token>), which the stream captures; the worker answers msg.Reply as it
// always does. The token is unguessable and recorded in the ledger before
// the request is sent, so that only the ledger knows where to look.
package ledger

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

// Retention outlives Core's purge of stuck runs (24 h).
const Retention = 25 * time.Hour

// Config names the ledger's JetStream objects.
type Config struct {
	// Prefix is the tools' subject prefix; replies go under
	// <Prefix>.replies.
	Prefix string
	// Instance is this sidecar's stable name (the pod's): its replies
	// are <Prefix>.replies.<Instance>.<token>.
	Instance string
	// Replicas of the bucket and the stream on a cluster. default: 1
	Replicas int
	// MaxBytes bounds each stream and bucket (the outcome ledger, the
	// replies, dedupe results, claim-checked results, approvals). default:
	// 1 GiB
	MaxBytes int64
	// MaxReplyBytes bounds a message of the reply stream, which workers
	// publish to; the buckets, which only sidecars write, are bounded by
	// the server's max payload. default: 8 MiB
	MaxReplyBytes int32
	// JournalTTL is how long the journal of OpenAI-compatible runs keeps a
	// record. default: 24h
	JournalTTL time.Duration
}

// Ledger records dispatches and finds the replies that outlived a sidecar.
type Ledger struct {
	cfg     Config
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	memo    jetstream.KeyValue
	results jetstream.ObjectStore
	replies jetstream.Stream
	// approvals holds the calls waiting for a person, by Action ID
	// (approvals.go).
	approvals jetstream.KeyValue
	// journal holds OpenAI-compatible runs (journal.go, package runstore).
	journal jetstream.KeyValue
}

// Entry is what the ledger knows of one call.
type Entry struct {
	RunID      string    `json:"run_id"`
	Tool       string    `json:"tool"`
	Attempt    int       `json:"attempt"`
	Reply      string    `json:"reply"` // the attempt's reply subject
	Instance   string    `json:"instance"`
	Dispatched time.Time `json:"dispatched"`
	// Deadline is when the attempt's timeout ends if no progress came.
	Deadline time.Time `json:"deadline"`
	// InProcess: the attempt ran in the sidecar's own process (routes
	// exec, http, mcp), whose outcome only that process could store: a
	// restarted sidecar does not wait for it.
	InProcess bool `json:"in_process,omitempty"`
	// Outcome is the outcome of an attempt run in process, when it is
	// kept in the entry.
	Outcome *Stored `json:"outcome,omitempty"`
	// Format is entryFormat for an entry of a sidecar that records the
	// calls it runs in process; 0 for one of an earlier release.
	Format int `json:"format,omitempty"`
}

// entryFormat is the format of the entries this sidecar writes: calls run
// in process are recorded as calls sent to workers are.
const entryFormat = 2

// ErrNoJetStream: the NATS server offers no JetStream.
var ErrNoJetStream = errors.New("ledger: the NATS server has no JetStream")

// Open creates (or finds) the bucket and the stream.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Ledger, error) {
	if cfg.Replicas < 1 {
		cfg.Replicas = 1
	}
	cfg.MaxBytes = cmp.Or(max(cfg.MaxBytes, 0), 1<<30)
	cfg.MaxReplyBytes = cmp.Or(max(cfg.MaxReplyBytes, 0), 8<<20)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoJetStream, err)
	}
	name := bucketName(cfg.Prefix)
	cfg.JournalTTL = cmp.Or(max(cfg.JournalTTL, 0), 24*time.Hour)
	kvBucketTTL := func(suffix, desc string, ttl time.Duration) (jetstream.KeyValue, error) {
		return create(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
			return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name + suffix, TTL: ttl,
				Replicas: cfg.Replicas, Storage: jetstream.FileStorage, Description: desc, MaxBytes: cfg.MaxBytes})
		})
	}
	kvBucket := func(suffix, desc string) (jetstream.KeyValue, error) { return kvBucketTTL(suffix, desc, Retention) }
	kv, err := kvBucket("_LEDGER", "toolsidecar outcome ledger, by Action ID")
	if err != nil {
		return nil, fmt.Errorf("ledger: bucket: %w", err)
	}
	st, err := create(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		// The last message of a subject is the one read (a final reply
		// follows its progress): one is kept per subject, so that a
		// worker repeating a reply stores it once.
		return js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name + "_REPLIES", Subjects: []string{wire.RepliesWildcard(cfg.Prefix)},
			MaxAge: Retention, Replicas: cfg.Replicas, Storage: jetstream.FileStorage, Description: "toolsidecar worker replies",
			MaxBytes: cfg.MaxBytes, MaxMsgSize: cfg.MaxReplyBytes, MaxMsgsPerSubject: 1, Discard: jetstream.DiscardOld})
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: reply stream: %w", err)
	}
	memo, err := kvBucket("_DEDUPE", "toolsidecar results that answer repeated calls, by run, tool and arguments")
	if err != nil {
		return nil, fmt.Errorf("ledger: dedupe bucket: %w", err)
	}
	results, err := create(ctx, func(ctx context.Context) (jetstream.ObjectStore, error) {
		return js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: name + "_RESULTS", TTL: Retention,
			Replicas: cfg.Replicas, Storage: jetstream.FileStorage, Description: "toolsidecar results stored by claim-check, by run and handle",
			MaxBytes: cfg.MaxBytes})
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: result store: %w", err)
	}
	approvals, err := kvBucket("_APPROVALS", "toolsidecar approvals, pending and decided, by Action ID")
	if err != nil {
		return nil, fmt.Errorf("ledger: approval bucket: %w", err)
	}
	journal, err := kvBucketTTL("_JOURNAL", "toolsidecar journal of OpenAI-compatible runs: turns, outputs, ends", cfg.JournalTTL)
	if err != nil {
		return nil, fmt.Errorf("ledger: journal bucket: %w", err)
	}
	return &Ledger{cfg: cfg, js: js, kv: kv, memo: memo, results: results, replies: st, approvals: approvals, journal: journal}, nil
}

// PutResult stores a result by claim-check; it expires with the ledger.
func (l *Ledger) PutResult(ctx context.Context, name string, data []byte) error {
	if _, err := l.results.PutBytes(ctx, name, data); err != nil {
		return fmt.Errorf("ledger: storing result %s: %w", name, err)
	}
	return nil
}

// GetResult returns a result stored by claim-check.
func (l *Ledger) GetResult(ctx context.Context, name string) ([]byte, bool, error) {
	b, err := l.results.GetBytes(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("ledger: reading result %s: %w", name, err)
	}
	return b, true, nil
}

// Recall returns the result remembered under key (a hex digest).
func (l *Ledger) Recall(ctx context.Context, key string) ([]byte, bool, error) {
	e, err := l.memo.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("ledger: recall: %w", err)
	}
	return e.Value(), true, nil
}

// Remember stores a result under key, for repeats of its call; a result
// too large for one NATS message is refused with an error.
func (l *Ledger) Remember(ctx context.Context, key string, value []byte) error {
	if _, err := l.memo.Put(ctx, key, value); err != nil {
		return fmt.Errorf("ledger: remember: %w", err)
	}
	return nil
}

// Inbox is this sidecar's reply namespace: the bridge sends requests with
// reply subjects under it.
func (l *Ledger) Inbox() string { return l.cfg.Prefix + ".replies." + l.cfg.Instance }

// Dispatched records an attempt before it is sent: a restarted sidecar
// then knows the call may have run, and where its reply is.
//
// For an unsafe tool it returns once JetStream has stored the record, so
// that "no record" proves "never sent". For other tools the record is
// published without waiting for its acknowledgement (it leaves ahead of
// the request, on the same connection, and is normally stored long before
// the worker answers): should the sidecar die before it is stored, the
// call merely runs again on the next drive, as such tools may. This keeps
// durable mode's cost per call low (BENCHMARKS.md).
func (l *Ledger) Dispatched(ctx context.Context, req tool.Request, runID, reply string) error {
	return l.record(ctx, req, runID, reply, false, nil)
}

// Running records an attempt of a call that runs in the sidecar's own
// process (routes exec, http, mcp) before it starts, as Dispatched does
// for one sent to a worker, and returns the reply subject under which
// [Ledger.Ran] may store its outcome. The crash rule is then one for every
// route: a recorded unsafe attempt without a stored outcome has an unknown
// effect, and a stored outcome is the call's outcome. Only an unsafe
// attempt is recorded before it runs (and acknowledged): any other may run
// again, so its record and outcome are written together as it ends.
func (l *Ledger) Running(ctx context.Context, req tool.Request, runID string) (reply string, err error) {
	if !req.Unsafe {
		return "", nil
	}
	reply = l.newReply()
	return reply, l.record(ctx, req, runID, reply, true, nil)
}

// newReply is a reply subject of this sidecar's inbox for an outcome the
// sidecar stores itself: an unguessable token, as a worker's reply's.
func (l *Ledger) newReply() string {
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	return l.Inbox() + "." + base64.RawURLEncoding.EncodeToString(tok[:])
}

// maxInline bounds an outcome written inside its ledger entry; a larger
// one goes to the reply stream. The bucket refuses writes once full, and an
// unsafe call is not run without its record: entries stay small (a result
// of 64 KiB per read-only call filled 1 GiB in 12,000 calls), while the
// stream drops its oldest messages instead.
const maxInline = 256

// Ran stores the outcome of an attempt that [Ledger.Running] saw start,
// where Recover finds it. An unsafe call's outcome is stored on its reply
// subject, as a worker's reply is captured, before Ran returns. Another's
// is written without waiting, inside its ledger entry (one write, where a
// worker's call costs two), or, when large, as an entry and a reply; should
// it be lost, the call merely runs again. An outcome that never reached the
// tool is not stored: for an unsafe call the record goes back to "about to
// be sent", so that a recovery may still run it.
func (l *Ledger) Ran(ctx context.Context, req tool.Request, runID, reply string, out tool.Outcome) error {
	if !out.Sent {
		if !req.Unsafe {
			return nil
		}
		return l.Intend(ctx, req.ActionID, runID, req.Tool)
	}
	size := len(out.Data)
	if out.Err != nil {
		size = len(out.Err.Message)
	}
	if !req.Unsafe && size <= maxInline {
		return l.record(ctx, req, runID, "", true, storedOf(out))
	}
	if !req.Unsafe {
		reply = l.newReply() // Running recorded nothing
		if err := l.record(ctx, req, runID, reply, true, nil); err != nil {
			return err
		}
	}
	m := &nats.Msg{Subject: reply, Data: out.Data}
	if out.Err != nil {
		m = wire.ErrorMsg(reply, out.Err)
	}
	var err error
	if req.Unsafe {
		_, err = l.js.PublishMsg(ctx, m)
	} else {
		_, err = l.js.PublishMsgAsync(m)
	}
	if err != nil {
		return fmt.Errorf("ledger: storing the outcome of %s: %w", tool.Excerpt(req.ActionID), err)
	}
	return nil
}

// Stored is an outcome kept inside its ledger entry.
type Stored struct {
	Data    []byte `json:"data,omitempty"`
	ErrType string `json:"error_type,omitempty"`
	ErrCode int    `json:"error_code,omitempty"`
	Error   string `json:"error,omitempty"`
}

// storedOf keeps an outcome as a worker's reply would carry it: an error's
// message on one line, as its header does.
func storedOf(out tool.Outcome) *Stored {
	if out.Err != nil {
		m := wire.DecodeOutcome(wire.ErrorMsg("", out.Err), 0)
		return &Stored{ErrType: string(m.Err.Type), ErrCode: m.Err.Code, Error: m.Err.Message}
	}
	return &Stored{Data: out.Data}
}

func (s *Stored) outcome() tool.Outcome {
	if s.ErrType != "" {
		return tool.Outcome{Sent: true, Err: &tool.Error{Type: tool.ErrorType(s.ErrType), Code: s.ErrCode, Message: s.Error}}
	}
	return tool.Outcome{Sent: true, Data: s.Data}
}

// record writes the ledger entry of an attempt: acknowledged for an unsafe
// tool, published without waiting for another's. An attempt run in the
// sidecar's process has a nil outcome before it ends, and its outcome (or
// a reply subject for it) after.
func (l *Ledger) record(ctx context.Context, req tool.Request, runID, reply string, inProcess bool, outcome *Stored) error {
	if err := tool.CheckID("action_id", req.ActionID); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	now := time.Now().UTC()
	e := Entry{RunID: runID, Tool: req.Tool, Attempt: req.Attempt, Reply: reply, Instance: l.cfg.Instance, Dispatched: now,
		Deadline: now.Add(req.TimeoutOrDefault()), InProcess: inProcess, Outcome: outcome, Format: entryFormat}
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if req.Unsafe {
		_, err = l.kv.Put(ctx, req.ActionID, data)
	} else {
		_, err = l.js.PublishMsgAsync(&nats.Msg{Subject: "$KV." + l.kv.Bucket() + "." + req.ActionID, Data: data})
	}
	if err != nil {
		return fmt.Errorf("ledger: recording dispatch of %s: %w", req.ActionID, err)
	}
	return nil
}

// Intend records, before an unsafe call's Action is marked processing,
// that the call is about to be sent. An Action found processing later
// then tells apart a call that never left (an entry without a reply
// subject: it may run now) from one whose fate is unknown (no entry: it
// was marked by a sidecar without a ledger).
func (l *Ledger) Intend(ctx context.Context, actionID, runID, toolName string) error {
	if err := tool.CheckID("action_id", actionID); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	data, err := json.Marshal(Entry{RunID: runID, Tool: toolName, Instance: l.cfg.Instance, Format: entryFormat})
	if err != nil {
		return err
	}
	if _, err := l.kv.Put(ctx, actionID, data); err != nil {
		return fmt.Errorf("ledger: recording the intent to send %s: %w", actionID, err)
	}
	return nil
}

// Reply is the last message the stream captured on a reply subject.
func (l *Ledger) Reply(ctx context.Context, subject string) (*nats.Msg, bool, error) {
	raw, err := l.replies.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("ledger: reply on %s: %w", subject, err)
	}
	return &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, true, nil
}

// awaitEvery is how often Recover looks for a reply it awaits.
const awaitEvery = 100 * time.Millisecond

// Recover returns the final reply of the last recorded attempt of an
// action, when the stream has one. With await, a reply that has not come
// is waited for until the attempt's deadline (a worker's reply may still
// be on its way: buffered through a reconnect, say). ok is false when no
// final reply came (or nothing was recorded); when the call's intent was
// recorded (Intend) but no attempt, the error wraps tool.ErrNeverSent.
func (l *Ledger) Recover(ctx context.Context, actionID string, await bool) (out tool.Outcome, ok bool, err error) {
	for {
		out, ok, deadline, err := l.lookup(ctx, actionID)
		if ok || err != nil || !await || deadline.IsZero() || time.Now().After(deadline) {
			return out, ok, err
		}
		t := time.NewTimer(min(awaitEvery, time.Until(deadline)+time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return out, false, ctx.Err()
		case <-t.C:
		}
	}
}

// lookup reads the ledger entry and its reply once.
func (l *Ledger) lookup(ctx context.Context, actionID string) (out tool.Outcome, ok bool, deadline time.Time, err error) {
	if tool.CheckID("action_id", actionID) != nil {
		return out, false, time.Time{}, nil // no such key can exist
	}
	kve, err := l.kv.Get(ctx, actionID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return out, false, time.Time{}, nil
	}
	if err != nil {
		return out, false, time.Time{}, fmt.Errorf("ledger: reading %s: %w", actionID, err)
	}
	var e Entry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return out, false, time.Time{}, fmt.Errorf("ledger: entry of %s: %w", actionID, err)
	}
	if e.Outcome != nil {
		return e.Outcome.outcome(), true, time.Time{}, nil
	}
	if e.Reply == "" { // intended, never dispatched
		if e.Format < entryFormat {
			return out, false, time.Time{}, fmt.Errorf("ledger: %s was never dispatched to a worker: %w (%w)", actionID, tool.ErrNeverSent, tool.ErrIntentOfOldFormat)
		}
		return out, false, time.Time{}, fmt.Errorf("ledger: %s was never dispatched: %w", actionID, tool.ErrNeverSent)
	}
	if e.InProcess {
		// Only the process that ran the attempt could store its outcome:
		// no later reply is waited for.
		e.Deadline = time.Time{}
	}
	m, found, err := l.Reply(ctx, e.Reply)
	if err != nil || !found {
		return out, false, e.Deadline, err
	}
	if wire.IsProgress(m) {
		return out, false, e.Deadline, nil // the call was alive; its result has not come
	}
	return wire.DecodeOutcome(m, 0), true, e.Deadline, nil
}
