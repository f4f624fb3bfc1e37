// Package discovery finds workers on the bus the way NATS micro services
// are found (ADR-32): the Go worker library is a micro service, and the
// other libraries answer $SRV.INFO like one, so one probe ([Probe]) finds
// every kind.
package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

// InfoSubject is micro's discovery subject that every service answers.
const InfoSubject = "$SRV.INFO"

// DefaultWait is how long a probe collects answers by default.
const DefaultWait = 250 * time.Millisecond

// ServiceInfo is micro's INFO response, reduced to what liveness needs.
type ServiceInfo struct {
	Type      string            `json:"type"`
	Name      string            `json:"name"`
	ID        string            `json:"id"`
	Version   string            `json:"version"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Endpoints []Endpoint        `json:"endpoints"`
}

// Endpoint is one endpoint of a [ServiceInfo].
type Endpoint struct {
	Name       string            `json:"name"`
	Subject    string            `json:"subject"`
	QueueGroup string            `json:"queue_group,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

// Bounds of one probe, whatever the bus sends: the answers kept, the
// bytes of one answer (larger ones are skipped), and of all of them (the
// probe reads no further). Any bus client may answer $SRV.INFO, as often
// as it likes.
const (
	MaxServices    = 10000
	MaxAnswerBytes = 4 << 20
	MaxProbeBytes  = 32 << 20
)

// Probe asks every service on the bus for its endpoints ($SRV.INFO) and
// returns the answers collected within wait. Undecodable and oversized
// answers are skipped.
func Probe(ctx context.Context, nc *nats.Conn, wait time.Duration) ([]ServiceInfo, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("discovery: probe: %w", err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(InfoSubject, inbox, nil); err != nil {
		return nil, fmt.Errorf("discovery: probe: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var out []ServiceInfo
	read := 0
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return out, nil // the wait is over
		}
		if read += len(m.Data); read > MaxProbeBytes {
			return out, nil
		}
		var info ServiceInfo
		if len(m.Data) <= MaxAnswerBytes && json.Unmarshal(m.Data, &info) == nil {
			out = append(out, info)
		}
		if len(out) == MaxServices {
			return out, nil
		}
	}
}

// Answer is one worker's answer to a describe request: the declaration
// of the tool, and the worker as it names itself (tool.HeaderWorker).
type Answer struct {
	Declaration []byte
	Worker      string
}

// MaxDescribeBytes bounds the declarations one [Describe] keeps of the
// tools not in force (past it, it reads no more of them), and the answers
// it holds before it reads them (past it, NATS drops them).
const MaxDescribeBytes = 32 << 20

// Described is what the workers of one tool answered a describe request.
type Described struct {
	// Answers holds the first declaration given, if any: a queue group
	// hands the request to one worker, which answers once.
	Answers []Answer
	// Repeats count the declarations given after the first: a responder
	// may answer one request as often as it likes, so they are dropped
	// unkept.
	Repeats int
	// Refusals count the answers that were errors or oversized: the
	// worker serves the tool without a declaration, or predates describe.
	Refusals int
	// NoResponders: nobody serves the tool's subject.
	NoResponders bool
	// Cut: this tool is not in force, and its declaration would have
	// taken the describe past MaxDescribeBytes. It was dropped, and no
	// tool not in force was read after it.
	Cut bool
}

// Describe asks, on each of subjects (a tool's own subject each), for the
// tool's declaration, and returns what came within wait, by subject. NATS
// delivers each request only to the clients its permissions let
// subscribe to that subject, and lets them alone answer it: the answers
// come from workers that may serve the tool, whatever $SRV.INFO said. An
// answer over maxBytes is refused. Whatever the workers send, it keeps
// one declaration a subject. The first inForce subjects are the tools in
// force: they are read whatever the others declare, so that no worker can
// keep them unread with declarations of names it makes up; the others
// are read while the declarations kept stay within MaxDescribeBytes. What
// it keeps is thus bounded by MaxDescribeBytes and inForce declarations.
func Describe(ctx context.Context, nc *nats.Conn, subjects []string, inForce int, wait time.Duration, maxBytes int) ([]Described, error) {
	l := &describing{out: make([]Described, len(subjects)), inForce: inForce, pending: len(subjects), pendingInForce: min(inForce, len(subjects)),
		maxBytes: maxBytes, done: make(chan struct{})}
	if len(subjects) == 0 {
		return l.out, nil
	}
	inbox := nc.NewInbox()
	// A handler, not a sync subscription: nats.go turns a "no responders"
	// status into an error on NextMsg, which would lose its subject. The
	// pending limit bounds the bytes that wait for the handler.
	sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) { l.take(m, len(inbox)+1) })
	if err != nil {
		return nil, fmt.Errorf("discovery: describe: %w", err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, MaxDescribeBytes); err != nil {
		return nil, fmt.Errorf("discovery: describe: %w", err)
	}
	for i, subject := range subjects {
		if err := nc.PublishMsg(wire.DescribeMsg(subject, inbox+"."+strconv.Itoa(i))); err != nil {
			return nil, fmt.Errorf("discovery: describe %s: %w", subject, err)
		}
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-l.done:
	case <-timer.C:
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true // the handler, still subscribed, writes no more
	return l.out, nil
}

// describing is one Describe's answers as they come.
type describing struct {
	maxBytes int
	inForce  int           // the subjects below it are tools in force
	done     chan struct{} // closed when every subject to read is answered

	mu             sync.Mutex
	out            []Described
	pending        int  // subjects without an answer yet
	pendingInForce int  // of them, tools in force
	kept           int  // bytes of the declarations kept
	full           bool // a tool not in force was cut: no more of them are read
	ended          bool // done is closed, or Describe returned
}

// take applies one answer; cut is where the subject's index starts.
func (l *describing) take(m *nats.Msg, cut int) {
	i, err := strconv.Atoi(m.Subject[cut:])
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || err != nil || i < 0 || i >= len(l.out) {
		return
	}
	inForce := i < l.inForce
	if l.full && !inForce {
		return
	}
	d := &l.out[i]
	if len(d.Answers)+d.Repeats+d.Refusals == 0 && !d.NoResponders {
		l.pending--
		if inForce {
			l.pendingInForce--
		}
	}
	switch {
	case wire.IsNoResponders(m):
		d.NoResponders = true
	case len(m.Data) == 0 || len(m.Data) > l.maxBytes || m.Header.Get(tool.HeaderServiceCode) != "" || m.Header.Get(tool.HeaderErrorType) != "":
		d.Refusals++
	case len(d.Answers) > 0:
		d.Repeats++
	case !inForce && l.kept+len(m.Data) > MaxDescribeBytes:
		d.Cut, l.full = true, true
	default:
		l.kept += len(m.Data)
		d.Answers = append(d.Answers, Answer{Declaration: m.Data, Worker: m.Header.Get(tool.HeaderWorker)})
	}
	if l.pending == 0 || l.full && l.pendingInForce == 0 {
		l.ended = true
		close(l.done)
	}
}
