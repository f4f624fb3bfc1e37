// Package frames bounds the frames of a stream while it is read: the
// events of a server-sent event stream, or the lines of a JSON-lines
// stream. A frame within the bound passes unchanged; a longer one is never
// held whole: its first Max bytes and its last TailBytes are kept, the rest
// is skipped as it arrives, and the frame is replaced by what the caller's
// Replace makes of them (an error in the stream's own shape, for the one
// call the frame answered). The stream itself goes on.
//
// The SSE decoders in use (go-sse, the MCP SDK's) end the whole stream at
// an event over their bound: one oversized answer would fail every call
// that shares the stream or the session. Reading through a [Reader] makes
// it that answer's failure only.
package frames

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// Kind is how a stream is cut into frames.
type Kind int

const (
	// Lines: each line, its '\n' included, is a frame (JSON lines, the MCP
	// stdio transport, or a whole body without a newline).
	Lines Kind = iota
	// Events: lines up to and including an empty line are a frame (SSE).
	// A line ends at '\n'; a '\r' before it belongs to the line ending.
	Events
	// Whole: the whole stream is one frame (a JSON body).
	Whole
)

// TailBytes is how much of an oversized frame's end is kept for Replace:
// serializers that write a JSON-RPC response's "id" after its result put
// it there.
const TailBytes = 4 << 10

// Oversized describes a frame longer than the bound, for Replace.
type Oversized struct {
	Head []byte // the frame's first Max bytes
	Tail []byte // its last TailBytes bytes (less for a shorter remainder)
	Size int64  // its whole length
}

// Reader reads a stream frame by frame; see the package comment.
type Reader struct {
	r   *bufio.Reader
	max int
	// kind and replace say how frames end and what an oversized one
	// becomes: its replacement's bytes, which go to the reader instead
	// (nil: the frame is dropped).
	kind    Kind
	replace func(Oversized) []byte
	// Keep, when set, is asked about each frame within the bound: a frame
	// it refuses is dropped.
	Keep func(frame []byte) bool

	frame []byte // the frame being read, while it is within the bound
	out   []byte // bytes ready for Read
	err   error  // the underlying reader's error, after out
}

// NewReader reads r as frames of kind, each at most max bytes.
func NewReader(r io.Reader, kind Kind, max int, replace func(Oversized) []byte) *Reader {
	// A line longer than the buffer is read on in pieces (ReadSlice), so
	// the buffer need not fit a frame: at thousands of open streams its
	// size is allocated per stream.
	return &Reader{r: bufio.NewReaderSize(r, 4<<10), max: max, kind: kind, replace: replace}
}

// Read implements io.Reader.
func (f *Reader) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		f.next()
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// next reads one frame (or what is left at the end) into out.
func (f *Reader) next() {
	f.frame = f.frame[:0]
	var (
		big  *Oversized
		tail []byte
	)
	for {
		line, err := f.r.ReadSlice('\n')
		if len(line) > 0 {
			switch {
			case big != nil:
				big.Size += int64(len(line))
				tail = keepTail(tail, line)
			case len(f.frame)+len(line) > f.max:
				head := append(f.frame, line...)[:f.max]
				big = &Oversized{Head: bytes.Clone(head), Size: int64(len(f.frame) + len(line))}
				tail = keepTail(nil, append(f.frame, line...))
			default:
				f.frame = append(f.frame, line...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // a line longer than the buffer: read on
		}
		if err != nil {
			f.err = err
		}
		if err != nil || f.frameEnds(line) {
			break
		}
	}
	if big != nil {
		big.Tail = tail
		f.out = f.replace(*big)
		return
	}
	if f.Keep != nil && !f.Keep(f.frame) {
		return // dropped: Read goes on to the next frame
	}
	// Read consumes out before next reuses the frame's buffer.
	f.out = f.frame
	if cap(f.frame) > 1<<20 {
		f.frame = nil // one large frame does not pin its buffer
	}
}

// frameEnds reports whether a frame ends after line (a whole line, with
// its '\n').
func (f *Reader) frameEnds(line []byte) bool {
	switch f.kind {
	case Lines:
		return true
	case Events:
		return len(bytes.TrimRight(line, "\r\n")) == 0
	}
	return false
}

// TopLevel reads the scalar members of a JSON object (strings, numbers,
// literals, as their JSON) as far as its text goes, and skips nested
// values by their brackets: the head of a frame that was cut, or of one
// that is malformed further on, still gives its ids.
func TopLevel(data []byte) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return out
	}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return out
		}
		key, _ := kt.(string)
		start := dec.InputOffset()
		vt, err := dec.Token()
		if err != nil {
			return out
		}
		if _, nested := vt.(json.Delim); !nested {
			out[key] = json.RawMessage(bytes.TrimLeft(data[start:dec.InputOffset()], " \t\r\n:"))
			continue
		}
		for level := 1; level > 0; {
			t, err := dec.Token()
			if err != nil {
				return out
			}
			switch t {
			case json.Delim('{'), json.Delim('['):
				level++
			case json.Delim('}'), json.Delim(']'):
				level--
			}
		}
	}
	return out
}

// keepTail appends b to tail and keeps the last TailBytes.
func keepTail(tail, b []byte) []byte {
	if len(b) >= TailBytes {
		return append(tail[:0], b[len(b)-TailBytes:]...)
	}
	tail = append(tail, b...)
	if len(tail) > TailBytes {
		tail = append(tail[:0], tail[len(tail)-TailBytes:]...)
	}
	return tail
}
