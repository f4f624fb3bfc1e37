package frames_test

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/projectdavid/toolsidecar/internal/frames"
)

func marker(o frames.Oversized) []byte {
	tail := bytes.TrimSpace(o.Tail)
	return fmt.Appendf(nil, "[%d bytes: %s…%s]\n\n", o.Size, o.Head[:min(5, len(o.Head))], tail[max(0, len(tail)-6):])
}

// TestEvents: events within the bound pass byte for byte; a longer one is
// replaced, with its head, tail and size, and the events after it pass.
func TestEvents(t *testing.T) {
	big := "data: {" + strings.Repeat("x", 100<<10) + "\"id\":7}\n\n"
	in := "data: a\n\n" + "data: b\r\ndata: c\r\n\r\n" + big + "data: d\n\n" + "data: tail-without-end"
	// One byte at a time: a frame may arrive in any number of reads.
	got, err := io.ReadAll(frames.NewReader(iotest.OneByteReader(strings.NewReader(in)), frames.Events, 64, marker))
	if err != nil {
		t.Fatal(err)
	}
	want := "data: a\n\n" + "data: b\r\ndata: c\r\n\r\n" + fmt.Sprintf("[%d bytes: data:…id\":7}]\n\n", len(big)) + "data: d\n\n" + "data: tail-without-end"
	if string(got) != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// TestLinesDropped: a nil replacement drops the frame; the stream goes on.
func TestLinesDropped(t *testing.T) {
	in := "{\"a\":1}\n" + strings.Repeat("y", 1<<20) + "\n{\"b\":2}"
	var seen frames.Oversized
	got, err := io.ReadAll(frames.NewReader(strings.NewReader(in), frames.Lines, 16, func(o frames.Oversized) []byte { seen = o; return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "{\"a\":1}\n{\"b\":2}" {
		t.Errorf("got %q", got)
	}
	if seen.Size != 1<<20+1 || len(seen.Head) != 16 || len(seen.Tail) != frames.TailBytes {
		t.Errorf("oversized frame: size %d, head %d, tail %d", seen.Size, len(seen.Head), len(seen.Tail))
	}
}

// FuzzReader: with a bound no frame reaches, the stream is unchanged;
// with any bound, every frame out is within it or a replacement.
func FuzzReader(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: b\n\n"), 4)
	f.Add([]byte("x\r\n\r\n\n\nyyyyyyyy"), 2)
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		if max < 1 || max > 1<<16 {
			return
		}
		for _, kind := range []frames.Kind{frames.Lines, frames.Events} {
			got, err := io.ReadAll(frames.NewReader(bytes.NewReader(in), kind, len(in)+1, marker))
			if err != nil || !bytes.Equal(got, in) {
				t.Fatalf("kind %d, unbounded: %q %v, want the input", kind, got, err)
			}
			repl := []byte("R\n\n")
			out, err := io.ReadAll(frames.NewReader(bytes.NewReader(in), kind, max, func(frames.Oversized) []byte { return repl }))
			if err != nil {
				t.Fatal(err)
			}
			if len(out) > len(in)+len(repl)*(len(in)/max+1) {
				t.Fatalf("kind %d: %d bytes out of %d", kind, len(out), len(in))
			}
		}
	})
}
