package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// gated is a tool whose calls return their arguments once the test
// releases them, by their "q".
func gated(release map[string]chan struct{}) testenv.Tool {
	return testenv.Tool{Config: config.Tool{Name: "gate", Timeout: time.Minute}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
		var args struct{ Q string }
		_ = json.Unmarshal(c.Args, &args)
		select {
		case <-release[args.Q]:
			return testenv.Echo(ctx, c)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}
}

// sseEvent is one event as a client read it.
type sseEvent struct{ id, typ, data string }

// readUntil reads events from resp until stop says so or the stream ends.
func readUntil(t *testing.T, resp *http.Response, stop func([]sseEvent) bool) []sseEvent {
	t.Helper()
	var got []sseEvent
	for ev, err := range sse.Read(resp.Body, nil) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, sseEvent{ev.LastEventID, ev.Type, ev.Data})
		if stop(got) {
			break
		}
	}
	return got
}

func count(evs []sseEvent, typ string) int {
	n := 0
	for _, e := range evs {
		if e.typ == typ {
			n++
		}
	}
	return n
}

// TestDriveSSEResumes: a client whose stream drops mid-batch reconnects
// with Last-Event-ID and reads on from the event after it. The run went on
// while it was away (a call's outcome was submitted then), and the two
// streams together hold each event once, numbered without a gap.
func TestDriveSSEResumes(t *testing.T) {
	release := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	sc := newSidecar(t, coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "gate", ArgsJSON: `{"q": "a"}`}, {Tool: "gate", ArgsJSON: `{"q": "b"}`}}},
		{Content: "Answer: {{results}}"},
	}}, "", gated(release))
	r := sc.env.NewRun()

	first := sc.openSSE(t, r)
	before := readUntil(t, first, func(evs []sseEvent) bool { return count(evs, "tool_call") == 2 })
	first.Body.Close() // the connection drops with both calls in flight
	last := before[len(before)-1].id

	// While no client is attached, call a ends and its outcome is
	// submitted: the run was not cancelled by the drop.
	close(release["a"])
	var callA string
	poll.Until(t, "call a's outcome at Core", func() bool {
		for _, a := range sc.env.Sim.Actions(r.RunID) {
			if strings.Contains(string(a.FunctionArgs), `"a"`) && a.Status == core.ActionCompleted {
				callA = a.ToolCallID
				return true
			}
		}
		return false
	})

	req, _ := http.NewRequest("POST", sc.url+"/v1/runs/"+r.RunID+"/drive", strings.NewReader(sc.driveBody(r)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", last)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	after := readUntil(t, resp, func(evs []sseEvent) bool {
		if count(evs, "tool_result") == 1 {
			close(release["b"]) // b ends once the client is back
		}
		return false
	})

	// The ids go up across both streams (the drive numbers the events it
	// does not stream too, raw chunks among them): nothing read twice.
	all := append(before, after...)
	drive, _, _ := strings.Cut(last, "-")
	prev := 0
	for i, e := range all {
		d, n, _ := strings.Cut(e.id, "-")
		k, err := strconv.Atoi(n)
		if d != drive || err != nil || k <= prev {
			t.Fatalf("event %d (%s) has id %q after %s-%d", i, e.typ, e.id, drive, prev)
		}
		prev = k
	}
	if after[0].typ != "tool_result" || !strings.Contains(after[0].data, `"tool_call_id":"`+callA+`"`) {
		t.Errorf("the resumed stream starts with %s %s, want call a's result, sent while the client was away", after[0].typ, after[0].data)
	}
	if count(all, "turn") != 2 || count(all, "tool_call") != 2 || count(all, "tool_result") != 2 || all[len(all)-1].typ != "done" {
		t.Errorf("events %v", all)
	}
	var sum executor.Summary
	_ = json.Unmarshal([]byte(all[len(all)-1].data), &sum)
	if sum.Status != executor.StatusCompleted || !strings.HasPrefix(sum.Content, "Answer: ") {
		t.Errorf("summary %+v", sum)
	}
	sc.env.AssertWholeBatches(r, 2)
}

// TestDroppedSSEStreamCancelsAfterGrace: a stream that drops and is not
// resumed within server.sse_resume_grace cancels its run, as a JSON
// caller's leaving does at once; a Last-Event-ID that is not an event's id
// is refused.
func TestDroppedSSEStreamCancelsAfterGrace(t *testing.T) {
	started := make(chan struct{}, 1)
	env := testenv.Start(t, coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "slow"}}}, {Content: "never"}}},
		testenv.Options{Config: func(c *config.Config) { c.Server.SSEResumeGrace = 50 * time.Millisecond }},
		testenv.Tool{Config: config.Tool{Name: "slow", Timeout: time.Minute}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			started <- struct{}{}
			return testenv.Hang(ctx, c)
		}})
	sc := &sidecar{env: env, url: env.URL}
	r := env.NewRun()

	// Hostile ids: refused before anything is driven, quoted by no
	// answer, and the sidecar stays ready.
	for _, id := range []string{"x\u00e9-1", strings.Repeat("a", 5000) + "-1", "abc-" + strings.Repeat("9", 40), "abc-1\x00", "-1"} {
		bad, _ := http.NewRequest("POST", sc.url+"/v1/runs/"+r.RunID+"/drive", strings.NewReader(sc.driveBody(r)))
		bad.Header.Set("Content-Type", "application/json")
		bad.Header.Set("Accept", "text/event-stream")
		bad.Header.Set("Last-Event-ID", id)
		resp, err := http.DefaultClient.Do(bad)
		if err != nil {
			continue // a header value the client itself refuses to send
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(body), strings.Repeat("a", 200)) {
			t.Errorf("Last-Event-ID %.20q...: %d %.100s, want a 400 that does not quote it", id, resp.StatusCode, body)
		}
	}
	if ready, err := http.Get(sc.url + "/readyz"); err != nil || ready.StatusCode != http.StatusOK {
		t.Fatalf("after hostile Last-Event-IDs the sidecar is not ready: %v", err)
	} else {
		ready.Body.Close()
	}
	if n := env.Sim.CountRequests("POST", "/v1/completions"); n != 0 {
		t.Fatalf("%d completions requests for refused drives, want 0", n)
	}

	stream := sc.openSSE(t, r)
	<-started
	stream.Body.Close()
	poll.Until(t, "the action to be cancelled", func() bool {
		acts := env.Sim.Actions(r.RunID)
		return len(acts) == 1 && acts[0].Status == core.ActionCancelled
	})
	if n := env.Sim.CountRequests("POST", "/v1/completions"); n != 1 {
		t.Errorf("%d completions requests after the stream dropped, want 1", n)
	}
}
