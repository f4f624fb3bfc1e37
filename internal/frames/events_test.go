package frames

import (
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestReadEvents: the events within the bound pass as they came; one over
// it becomes what oversized makes of it, and the stream goes on; a stream
// that sends only comments is not idle, and one that falls silent is.
func TestReadEvents(t *testing.T) {
	pr, pw := io.Pipe()
	var idle atomic.Int32
	fired := make(chan struct{})
	ev := ReadEvents(pr, 64, func(o Oversized) []byte {
		return fmt.Appendf(nil, "event: %s\ndata: %d\n\n", OversizedEvent, o.Size)
	}, 300*time.Millisecond, func() { idle.Add(1); close(fired) })
	defer ev.Stop()
	go func() {
		pw.Write([]byte("data: one\n\n"))
		pw.Write([]byte("data: " + strings.Repeat("x", 200) + "\n\n"))
		for range 12 { // 600 ms of comments only, twice the idle time
			pw.Write([]byte(": keep-alive\n\n"))
			time.Sleep(50 * time.Millisecond)
		}
		pw.Write([]byte("data: two\n\n"))
		// then silence, until the idle timer fires
		<-fired
		pw.Close()
	}()
	var got []string
	for e, err := range ev.Seq {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Type+":"+e.Data)
		if len(got) == 3 {
			if n := idle.Load(); n != 0 {
				t.Errorf("a stream of comments was taken as idle")
			}
			break
		}
	}
	want := []string{":one", OversizedEvent + ":208", ":two"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events %q, want %q", got, want)
	}
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("a silent stream was never taken as idle")
	}
}
