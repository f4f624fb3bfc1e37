package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/internal/frames"
)

// Stream errors. A stream ends with io.EOF after [DONE]; every other end is
// one of these (or a transport error) so that callers can tell a clean end
// from a truncated one.
var (
	// ErrTruncated means the body ended without a [DONE] frame: the
	// connection dropped, or Core's router raised after its last frame.
	ErrTruncated = errors.New("core: stream ended without [DONE]")
	// ErrStreamIdle means no bytes arrived for longer than the idle limit.
	// Core sends no heartbeats, so the limit must exceed the slowest turn gap.
	ErrStreamIdle = errors.New("core: stream idle timeout")
)

// Stream is one open completions response. It is not safe for concurrent
// use; Close must be called once the caller is done with it. Read it with
// either Next or Chunks: Chunks reads without the extra goroutine that the
// pull-style Next needs.
type Stream struct {
	body   io.ReadCloser
	cancel context.CancelCauseFunc
	ctx    context.Context
	events iter.Seq2[sse.Event, error]
	next   func() (sse.Event, error, bool) // set on the first Next
	stop   func()
	read   *frames.EventStream // its events, and the idle timer
	done   bool
	err    error
	gap    func(time.Duration) // observes the silence before each frame
	last   time.Time
	// maxFrame bounds a frame while it is read; a longer one arrives as
	// its head only (oversizedFrame).
	maxFrame int
}

// Next returns the next chunk. A *FrameError reports one undecodable frame
// and the stream goes on; io.EOF reports the clean end ([DONE]); any other
// error ends the stream.
func (s *Stream) Next() (Chunk, error) {
	if s.done {
		return Chunk{}, s.err
	}
	if s.next == nil {
		s.next, s.stop = iter.Pull2(s.events)
	}
	for {
		ev, err, ok := s.next()
		if c, cerr, skip := s.step(ev, err, ok); !skip {
			return c, cerr
		}
	}
}

// Chunks ranges over the stream until its end. Frame errors are yielded as
// they come and iteration goes on; a clean end ([DONE]) yields nothing
// more; any other end is yielded last, as an error with a zero chunk.
func (s *Stream) Chunks() iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		if s.next != nil || s.done { // already read with Next: go on that way
			for {
				c, err := s.Next()
				if errors.Is(err, io.EOF) || !yield(c, err) || (err != nil && !errors.Is(err, ErrFrame)) {
					return
				}
			}
		}
		for ev, err := range s.events {
			c, cerr, skip := s.step(ev, err, true)
			switch {
			case skip:
				continue
			case errors.Is(cerr, io.EOF):
				return
			case !yield(c, cerr) || (cerr != nil && !errors.Is(cerr, ErrFrame)):
				return
			}
		}
		if !s.done { // the body ended without [DONE]
			c, cerr, _ := s.step(sse.Event{}, nil, false)
			yield(c, cerr)
		}
	}
}

// step turns one read result into a chunk or an error; skip reports a
// frame that carries nothing (id:- or event:-only).
func (s *Stream) step(ev sse.Event, err error, ok bool) (c Chunk, cerr error, skip bool) {
	if !ok {
		return Chunk{}, s.finish(ErrTruncated), false
	}
	if err != nil {
		if cause := context.Cause(s.ctx); cause != nil {
			err = cause
		}
		return Chunk{}, s.finish(fmt.Errorf("core: reading stream: %w", err)), false
	}
	if s.gap != nil {
		now := time.Now()
		s.gap(now.Sub(s.last))
		s.last = now
	}
	if ev.Data == "" {
		return Chunk{}, nil, true
	}
	if ev.Data == "[DONE]" {
		return Chunk{}, s.finish(io.EOF), false
	}
	if ev.Type == frames.OversizedEvent {
		c, cerr = decodeOversized([]byte(ev.Data), ev.LastEventID, s.maxFrame)
		return c, cerr, false
	}
	c, cerr = DecodeChunk([]byte(ev.Data))
	return c, cerr, false
}

func (s *Stream) finish(err error) error {
	s.done, s.err = true, err
	if b, ok := s.body.(*body); ok && err == io.EOF {
		b.rest(endWait) // [DONE]: the connection is kept once the body has ended
	}
	s.closeBody()
	return err
}

// endWait is how long the end of a stream's body is waited for after its
// [DONE]: Core ends it at once, a write behind (uvicorn ends a chunked
// body in a write of its own). A body still open after it has its
// connection closed.
const endWait = 20 * time.Millisecond

func (s *Stream) closeBody() {
	s.read.Stop()
	if s.stop != nil {
		s.stop()
	}
	s.body.Close()
	s.cancel(context.Canceled)
}

// Close releases the connection. Closing before the end abandons the rest
// of the turn.
func (s *Stream) Close() error {
	if !s.done {
		s.done, s.err = true, errors.New("core: stream closed")
		s.closeBody()
	}
	return nil
}

func newStream(ctx context.Context, cancel context.CancelCauseFunc, body io.ReadCloser, idle time.Duration, maxFrame int) *Stream {
	s := &Stream{body: body, cancel: cancel, ctx: ctx}
	s.read = frames.ReadEvents(body, maxFrame, oversizedFrame, idle, func() { cancel(ErrStreamIdle) })
	s.events = s.read.Seq
	s.maxFrame = maxFrame
	return s
}

// oversizedFrame passes on the head of a frame too long to read whole, as
// an event of its own type: its data is the start of the frame's JSON,
// from which a manifest's ids can still be read.
func oversizedFrame(o frames.Oversized) []byte {
	return fmt.Appendf(o.Head, "\nevent: %s\nid: %d\n\n", frames.OversizedEvent, o.Size)
}
