package agentsup

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/projectdavid/toolsidecar/agentsapi"
)

// ToolResultEvent is the type of the events the sidecar adds to an
// application's session stream, one per call it ran and answered: a type
// neither API sends, which the official clients pass on (or, in
// anthropic-sdk-go, drop) and an application may ignore.
const ToolResultEvent = "toolsidecar.tool_result"

// toldEvent is a result as the application's stream shows it, in the
// API's own naming.
func (e *Endpoint) toldEvent(session string, r agentsapi.Result) []byte {
	id := "tsc_" + actionID(session, r.Call.ID)
	if e.cfg.Kind == agentsapi.KindAnthropic {
		ev := map[string]any{"type": ToolResultEvent, "id": id, "custom_tool_use_id": r.Call.ID, "name": r.Call.Name,
			"is_error": !r.OK, "output": r.Output}
		if r.Call.ThreadID != "" {
			ev["session_thread_id"] = r.Call.ThreadID
		}
		data, _ := json.Marshal(ev)
		return fmt.Appendf(nil, "event: %s\ndata: %s\n\n", ToolResultEvent, data)
	}
	data, _ := json.Marshal(map[string]any{"type": ToolResultEvent, "event_id": id, "session_id": session, "turn_id": r.Call.TurnID,
		"call_id": r.Call.CallID, "name": r.Call.Name, "success": r.OK, "output": r.Output})
	return fmt.Appendf(nil, "data: %s\n\n", data)
}

// merged is an application's session stream with the sidecar's results
// added between the upstream's events. It owns two goroutines: one reads
// the upstream's stream line by line, one writes that and the results
// into the pipe the proxy reads; Close ends both.
type merged struct {
	pr     *io.PipeReader
	up     io.ReadCloser
	cancel func() // stops the results
	wg     sync.WaitGroup
	once   sync.Once
}

// mergeLine bounds a piece of a line handed on at once: a longer line
// goes on in pieces, and nothing is added inside it.
const mergeLine = 64 << 10

// merge adds the results told on results to the stream up, each between
// two of its events.
func (e *Endpoint) merge(session string, up io.ReadCloser, results <-chan agentsapi.Result, cancel func()) io.ReadCloser {
	pr, pw := io.Pipe()
	m := &merged{pr: pr, up: up, cancel: cancel}
	pieces := make(chan []byte)
	done := make(chan struct{})
	m.wg.Go(func() {
		defer close(pieces)
		br := bufio.NewReaderSize(up, mergeLine)
		for {
			piece, err := br.ReadSlice('\n')
			if len(piece) > 0 {
				select {
				case pieces <- bytes.Clone(piece):
				case <-done:
					return
				}
			}
			if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
				return
			}
		}
	})
	m.wg.Go(func() {
		defer close(done)
		atEvent := true // at the start, or just after an event's blank line
		lineEnded := true
		for {
			var told <-chan agentsapi.Result
			if atEvent {
				told = results
			}
			select {
			case piece, ok := <-pieces:
				if !ok {
					pw.Close()
					return
				}
				blank := lineEnded && (string(piece) == "\n" || string(piece) == "\r\n")
				lineEnded = piece[len(piece)-1] == '\n'
				atEvent = blank
				if _, err := pw.Write(piece); err != nil {
					return
				}
			case r := <-told:
				if _, err := pw.Write(e.toldEvent(session, r)); err != nil {
					return
				}
			}
		}
	})
	return m
}

func (m *merged) Read(p []byte) (int, error) { return m.pr.Read(p) }

// Close ends the stream: the upstream's, the pipe, both goroutines, and
// the subscription to results.
func (m *merged) Close() error {
	m.once.Do(func() {
		_ = m.pr.Close()
		_ = m.up.Close()
		m.wg.Wait()
		m.cancel()
	})
	return nil
}
