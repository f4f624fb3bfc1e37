package frames

import (
	"io"
	"iter"
	"sync"
	"time"

	sse "github.com/tmaxmax/go-sse"
)

// OversizedEvent is the type of the event that stands for one too long to
// read whole, as a stream's Replace writes it: no upstream names its events
// so (Core names none; the model APIs name theirs otherwise).
const OversizedEvent = "toolsidecar-oversized"

// EventStream is a server-sent event stream read with bounds: each event within
// bound bytes while it is read (a longer one becomes what oversized makes
// of it), and its silences within the idle time. One reader for every
// upstream: Core's completions and the model APIs' turns.
type EventStream struct {
	// Seq yields the events; after an error it yields no more.
	Seq  iter.Seq2[sse.Event, error]
	idle *idleTimer
}

// ReadEvents reads body's events. onIdle is called, once, when no event
// has come for idle (0: never): comments alone, which a server may send to
// keep a connection, do not keep a stream that says nothing alive. Stop
// ends the idle timer.
func ReadEvents(body io.Reader, bound int, oversized func(Oversized) []byte, idle time.Duration, onIdle func()) *EventStream {
	e := &EventStream{idle: newIdleTimer(idle, onIdle)}
	r := NewReader(body, Events, bound, oversized)
	// go-sse's own bound sits past the frames': an event reaches it only
	// cut to the frames' bound, with its field names.
	events := sse.Read(r, &sse.ReadConfig{MaxEventSize: bound + 1<<10})
	e.Seq = func(yield func(sse.Event, error) bool) {
		for ev, err := range events {
			e.idle.reset()
			if !yield(ev, err) {
				return
			}
		}
	}
	return e
}

// Stop ends the idle timer: the stream is closed or read to its end.
func (e *EventStream) Stop() { e.idle.stop() }

// idleTimer fires once when reset is not called within d.
type idleTimer struct {
	mu sync.Mutex
	t  *time.Timer
	d  time.Duration
}

func newIdleTimer(d time.Duration, fire func()) *idleTimer {
	it := &idleTimer{d: d}
	if d > 0 {
		it.t = time.AfterFunc(d, fire)
	}
	return it
}

func (it *idleTimer) reset() {
	if it.t != nil {
		it.mu.Lock()
		it.t.Reset(it.d)
		it.mu.Unlock()
	}
}

func (it *idleTimer) stop() {
	if it.t != nil {
		it.mu.Lock()
		it.t.Stop()
		it.mu.Unlock()
	}
}
