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
// whose events keep coming is not idle, and one that says nothing but
// comments is.
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
		for range 12 { // 600 ms of events, twice the idle time
			pw.Write([]byte("event: ping\ndata: x\n\n"))
			time.Sleep(50 * time.Millisecond)
		}
		pw.Write([]byte("data: two\n\n"))
		// then comments only, until the idle timer fires
		for {
			select {
			case <-fired:
				pw.Close()
				return
			case <-time.After(50 * time.Millisecond):
				pw.Write([]byte(": keep-alive\n\n"))
			}
		}
	}()
	var got []string
	for e, err := range ev.Seq { // read to the end: the comments too
		if err != nil {
			t.Fatal(err)
		}
		if e.Type == "ping" {
			continue
		}
		got = append(got, e.Type+":"+e.Data)
		if len(got) == 3 && idle.Load() != 0 {
			t.Errorf("a stream of events was taken as idle")
		}
	}
	want := []string{":one", OversizedEvent + ":208", ":two"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events %q, want %q", got, want)
	}
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("a stream of comments alone was never taken as idle")
	}
}
