package openaiup

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/modelapi"
	"github.com/projectdavid/toolsidecar/runstore"
)

// indexed reads the runs the index of digest lists.
func indexed(t *testing.T, j runstore.Journal, digest string) []string {
	t.Helper()
	runs, err := runstore.New(j).Runs(context.Background(), digest)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// A run without the application's key leaves its request's index when its
// end is journaled; the other runs of the request stay in it.
func TestEndedRunLeavesItsIndex(t *testing.T) {
	ctx := context.Background()
	j := runstore.NewMemoryJournal(time.Minute, 1<<20)
	u, err := New(Config{URL: "http://127.0.0.1:1", Journal: j, RetryBudget: time.Second, IdleTimeout: time.Second, MaxResponseBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	key := runKey{digest: "d"}
	var runs []*run
	for i := range 2 {
		r := u.Begin(runRef{id: fmt.Sprintf("chatcmpl-%d", i), fresh: true}, &request{key: key}, nil)
		if err := u.journalTurn(ctx, executor.Request{}, r, 1, turnRecord{Turn: runstore.Turn{Calls: []runstore.Call{{ActionID: "a", ToolCallID: "call_1", Tool: "echo"}}}}); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	if got := indexed(t, j, "d"); !slices.Equal(got, []string{"chatcmpl-0", "chatcmpl-1"}) {
		t.Fatalf("index %v, want both runs", got)
	}
	u.journalEnd(ctx, runs[0], executor.Summary{Status: executor.StatusCompleted})
	if got := indexed(t, j, "d"); !slices.Equal(got, []string{"chatcmpl-1"}) {
		t.Fatalf("index %v after the first run ended, want only the second", got)
	}
	if end, _, _ := j.Get(ctx, "end.chatcmpl-0"); end == nil {
		t.Fatal("the ended run has no end record")
	}
}

// gatedJournal holds the Put of one key until gate is closed, and lists
// the keys in the order they were written.
type gatedJournal struct {
	runstore.Journal
	key  string
	gate chan struct{}

	mu      sync.Mutex
	written []string
}

func (g *gatedJournal) Put(ctx context.Context, key string, value []byte) error {
	if key == g.key {
		<-g.gate
	}
	err := g.Journal.Put(ctx, key, value)
	g.mu.Lock()
	g.written = append(g.written, key)
	g.mu.Unlock()
	return err
}

func (g *gatedJournal) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.written)
}

// A run without the application's key answers without waiting for its
// last turn's record, still being written; its end is journaled after that
// record, which carries the turn before's outputs (no record of their own).
func TestKeylessAnswerLeavesItsRecordsForLater(t *testing.T) {
	ctx := context.Background()
	j := &gatedJournal{Journal: runstore.NewMemoryJournal(time.Minute, 1<<20), key: "turn.chatcmpl-1.2", gate: make(chan struct{})}
	u, err := New(Config{URL: "http://127.0.0.1:1", Journal: j, RetryBudget: time.Second, IdleTimeout: time.Second, MaxResponseBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r := u.Begin(runRef{id: "chatcmpl-1", fresh: true}, &request{key: runKey{digest: "d"}}, nil)
	if err := u.journalTurn(ctx, executor.Request{}, r, 1, turnRecord{Turn: runstore.Turn{Calls: []runstore.Call{{ActionID: "act_1", ToolCallID: "call_1", Tool: "echo"}}}}); err != nil {
		t.Fatal(err)
	}
	// Turn 2, the answer, is being written (as turn.end begins it), with
	// turn 1's output riding on it.
	p := newPendingTurn()
	p.written = make(chan struct{})
	r.mu.Lock()
	r.local, r.turn, r.pending = true, 2, p
	r.prev = &turnOutputs{n: 1, outs: map[string]string{"act_1": `{"echo":1}`}}
	r.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() {
		select {
		case <-j.gate:
		default:
			close(j.gate) // a failed test does not leave the write blocked
		}
	}()
	wg.Go(func() {
		defer close(p.written)
		if err := u.journalTurn(ctx, executor.Request{}, r, 2, turnRecord{Turn: runstore.Turn{Content: "answer"}}); err != nil {
			t.Error(err)
		}
	})
	ended := make(chan struct{})
	wg.Go(func() { defer close(ended); u.End(ctx, r, true) })
	select {
	case <-ended:
	case <-time.After(runstore.Timeout + time.Second):
		t.Fatal("the answer waited for its last turn's record")
	}
	journaled := make(chan struct{})
	wg.Go(func() {
		defer close(journaled)
		u.journalEnd(ctx, r, executor.Summary{Status: executor.StatusCompleted})
	})
	select {
	case <-journaled: // the memory journal takes a moment: an end that did not wait is written by now
		t.Fatal("the run's end was journaled while its last turn's record was still being written")
	case <-time.After(200 * time.Millisecond):
	}
	close(j.gate)
	<-journaled
	want := []string{"turn.chatcmpl-1.1", "turn.chatcmpl-1.2", "end.chatcmpl-1"}
	if got := j.order(); !slices.Equal(got, want) {
		t.Fatalf("records written %v, want %v: the last turn (with turn 1's outputs), then the end", got, want)
	}
	jr, err := runstore.New(j).Read(ctx, "chatcmpl-1")
	if err != nil || jr == nil || len(jr.Turns) != 2 || jr.Turns[1].Previous["act_1"] != `{"echo":1}` {
		t.Fatalf("the run read back %+v (%v), want turn 1's output in turn 2's record", jr, err)
	}
}

// A turn is journaled as sidecars before package runstore wrote it: the
// usage always, the application's calls only when there are some. The
// records below were written out by hand from that format; each reads
// back as the turn it was.
func TestTurnRecordFormat(t *testing.T) {
	app := modelapi.ToolCall{ID: "call_app", Type: "function"}
	app.Function.Name, app.Function.Arguments = "lookup", `{"q":"x"}`
	for _, tc := range []struct {
		rec  turnRecord
		want string
	}{
		{turnRecord{Turn: runstore.Turn{Content: "hello", Model: "gpt-x", Created: 1700000001, Finish: "tool_calls", Assistant: json.RawMessage(`{"role":"assistant"}`),
			Calls:    []runstore.Call{{MessageID: "call_1", ActionID: "act-1", ToolCallID: "call_1", Tool: "echo", Args: json.RawMessage(`{"n":1}`), Problem: "p"}},
			Previous: map[string]string{"act-0": "out"}},
			Usage:    modelapi.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15, CacheReadTokens: 3, ReasoningTokens: 2},
			AppCalls: []modelapi.ToolCall{app}},
			`{"content":"hello","usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"cache_read_input_tokens":3,"reasoning_tokens":2},` +
				`"model":"gpt-x","created":1700000001,"finish":"tool_calls","assistant":{"role":"assistant"},` +
				`"calls":[{"message_id":"call_1","action_id":"act-1","tool_call_id":"call_1","tool":"echo","args":{"n":1},"problem":"p"}],` +
				`"app_calls":[{"id":"call_app","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"x\"}"}}],"previous":{"act-0":"out"}}`},
		{turnRecord{Turn: runstore.Turn{Failed: "boom", Handed: []runstore.Call{{ActionID: "act-2", ToolCallID: "call_2", Tool: "echo", Args: json.RawMessage(`{}`)}}},
			AppCalls: []modelapi.ToolCall{}},
			`{"content":"","usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0},"failed":"boom",` +
				`"handed":[{"message_id":"","action_id":"act-2","tool_call_id":"call_2","tool":"echo","args":{}}]}`},
	} {
		got, err := json.Marshal(tc.rec.stored())
		if err != nil || string(got) != tc.want {
			t.Errorf("wrote\n%s (%v), want\n%s", got, err, tc.want)
		}
		var st runstore.Turn
		if err := json.Unmarshal([]byte(tc.want), &st); err != nil {
			t.Fatal(err)
		}
		back, err := turnOf(st)
		if err != nil || back.Usage != tc.rec.Usage || len(back.AppCalls) != len(tc.rec.AppCalls) ||
			(len(back.AppCalls) > 0 && back.AppCalls[0] != tc.rec.AppCalls[0]) || back.Content != tc.rec.Content {
			t.Errorf("read back %+v (%v), want %+v", back, err, tc.rec)
		}
	}
}
