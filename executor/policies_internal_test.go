package executor

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// Each policy is tested alone here: a call of its own, and a next step
// that counts its calls and answers as the test says. The whole chain is
// tested end to end with the loop (loop_test.go, features of the sidecar).

// policyExecutor is an executor with the bounds a policy reads.
func policyExecutor(cfg Config) *Executor {
	if cfg.MaxResultBytes == 0 {
		cfg.MaxResultBytes = 1 << 20
	}
	return &Executor{cfg: cfg, obs: nopObserver{}, memo: newMemMemo(1 << 20), results: memResults{newMemMemo(1 << 20)}, tools: registry.NewLive(nil)}
}

// testBatch is what the calls of one batch share.
type testBatch struct {
	drive, batch scope
	emit         Sink
	leavable     bool
}

func newTestBatch() *testBatch { return &testBatch{emit: func(Event) {}, leavable: true} }

// policyCall is call i of the batch, to tool def, as its policies see it.
func (b *testBatch) policyCall(i int, def *registry.Tool) *callIn {
	id := string(rune('a' + i))
	m := &ToolCall{RunID: "run_1", ActionID: "act_" + id, ToolCallID: "call_" + id, Tool: def.Name, Args: json.RawMessage(`{"q": "x"}`)}
	return &callIn{ToolCall: m, Tool: def, Turn: 1, Drive: &b.drive, Batch: &b.batch, Res: &CallResult{Turn: 1, ToolCallID: m.ToolCallID, ActionID: m.ActionID, Tool: m.Tool},
		Log: slog.New(slog.DiscardHandler), Emit: b.emit, Leavable: b.leavable}
}

// answering is a next step that answers reply and counts its calls.
type answering struct {
	reply tool.Outcome
	calls int
}

func (a *answering) next(context.Context, *callIn) answer {
	a.calls++
	return answer{Outcome: a.reply}
}

func failing(typ tool.ErrorType) tool.Outcome {
	return tool.Outcome{Err: tool.NewError(typ, "it failed")}
}

// TestLanePolicy: under skip_rest, the call after a failed one in its lane
// is skipped without being dispatched, saying why; a call of no lane, and
// a lane that continues, pass straight on; the second call of a lane
// starts only once the first has its outcome.
func TestLanePolicy(t *testing.T) {
	p := &lanes{maxResult: 1 << 20}
	b := newTestBatch()
	def := &registry.Tool{Name: "write", Policies: registry.Policies{Lane: &registry.Lane{Name: "db", SkipRest: true}}}
	first, second := b.policyCall(0, def), b.policyCall(1, def)
	for _, in := range []*callIn{first, second} {
		if !p.concerns(in) || p.admit(in) != nil || in.Res.Lane != "db" {
			t.Fatalf("call %s not admitted to its lane: %+v", in.ToolCallID, in.Res)
		}
	}
	fail := &answering{reply: failing(tool.ToolFailed)}
	ok := &answering{reply: tool.Outcome{Data: []byte("ok")}}
	done := make(chan answer, 1)
	go func() { done <- p.intercept(context.Background(), second, ok.next) }()
	select {
	case got := <-done:
		t.Fatalf("the second call of the lane ran before the first: %+v", got)
	case <-time.After(20 * time.Millisecond):
	}
	if got := p.intercept(context.Background(), first, fail.next); got.Err == nil || fail.calls != 1 {
		t.Fatalf("first call: %+v after %d dispatches", got, fail.calls)
	}
	got := <-done
	if got.Err == nil || got.Err.Type != tool.Skipped || ok.calls != 0 || !strings.Contains(got.Err.Message, "call_a (write)") {
		t.Errorf("the call after a failure: %+v after %d dispatches; want skipped, naming the failed call", got.Err, ok.calls)
	}
	free := b.policyCall(2, &registry.Tool{Name: "free"})
	if p.concerns(free) {
		t.Error("the lane policy concerns a call of no lane")
	}
	note := b.policyCall(3, &registry.Tool{Name: "note", Policies: registry.Policies{Lane: &registry.Lane{Name: "log"}}})
	p.admit(note)
	ok.calls = 0
	if got := p.intercept(context.Background(), note, ok.next); got.Err != nil || ok.calls != 1 {
		t.Errorf("%s: %+v after %d dispatches, want it dispatched", note.ToolCall.Tool, got.Err, ok.calls)
	}
	found := b.policyCall(4, def)
	found.Found = true
	if p.concerns(found) {
		t.Error("a call a reconciliation found runs in a lane, whose order is not known")
	}
}

// TestLanePolicyCancelled: a call waiting for its lane ends with the run.
func TestLanePolicyCancelled(t *testing.T) {
	p := &lanes{maxResult: 1 << 20}
	b := newTestBatch()
	def := &registry.Tool{Name: "write", Policies: registry.Policies{Lane: &registry.Lane{Name: "db"}}}
	first, second := b.policyCall(0, def), b.policyCall(1, def)
	p.admit(first)
	p.admit(second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ok := &answering{}
	if got := p.intercept(ctx, second, ok.next); got.Err == nil || got.Err.Type != tool.Cancelled || ok.calls != 0 {
		t.Errorf("%+v after %d dispatches, want cancelled", got.Err, ok.calls)
	}
}

// TestDedupePolicy: the first call of a dedupe tool is dispatched and its
// result remembered; an identical call of the run is answered from it
// without a dispatch, naming the call it came from; a failure is not
// remembered; a tool without dedupe is always dispatched.
func TestDedupePolicy(t *testing.T) {
	e := policyExecutor(Config{})
	p := &dedupe{e}
	b := newTestBatch()
	def := &registry.Tool{Name: "search", Policies: registry.Policies{DedupeTTL: time.Minute}}
	next := &answering{reply: tool.Outcome{Data: []byte(`"found"`)}}
	first := b.policyCall(0, def)
	if got := p.intercept(context.Background(), first, next.next); string(got.Data) != `"found"` || next.calls != 1 {
		t.Fatalf("first call: %s after %d dispatches", got.Data, next.calls)
	}
	again := b.policyCall(1, def)
	if got := p.intercept(context.Background(), again, next.next); string(got.Data) != `"found"` || next.calls != 1 || again.Res.DedupedFrom != "call_a" {
		t.Errorf("repeat: %s after %d dispatches, deduped from %q; want the first result, no dispatch, from call_a", got.Data, next.calls, again.Res.DedupedFrom)
	}

	failed := &answering{reply: failing(tool.Timeout)}
	other := b.policyCall(2, &registry.Tool{Name: "flaky", Policies: registry.Policies{DedupeTTL: time.Minute}})
	p.intercept(context.Background(), other, failed.next)
	p.intercept(context.Background(), other, failed.next)
	if failed.calls != 2 {
		t.Errorf("a failed result answered a repeat: %d dispatches, want 2", failed.calls)
	}
	if plain := b.policyCall(3, &registry.Tool{Name: "plain"}); p.concerns(plain) {
		t.Errorf("the dedupe policy concerns a tool without dedupe")
	}
}

// TestClaimCheckPolicy: a result over claim_check_bytes is stored and the
// model reads a preview with its handle; a small result, an error, and a
// result over the size limit (which settle turns into an error) pass
// unchanged.
func TestClaimCheckPolicy(t *testing.T) {
	e := policyExecutor(Config{ClaimCheckPreviewBytes: 4, ReadPageBytes: 10, MaxResultBytes: 100})
	p := &claimChecks{e}
	b := newTestBatch()
	def := &registry.Tool{Name: "big", Policies: registry.Policies{ClaimCheckBytes: 10}}
	c := b.policyCall(0, def)
	big := &answering{reply: tool.Outcome{Data: []byte(`"0123456789abcdef"`)}}
	got := p.intercept(context.Background(), c, big.next)
	var cc map[string]ClaimCheck
	if err := json.Unmarshal(got.Data, &cc); err != nil || cc["claim_check"].Handle != "call_a" || cc["claim_check"].Preview != `"012` || c.Res.ClaimCheck != "call_a" {
		t.Fatalf("large result became %s (%v), claim check %q", got.Data, err, c.Res.ClaimCheck)
	}
	stored, ok, err := e.results.GetResult(context.Background(), resultName("run_1", "call_a"))
	if err != nil || !ok || string(stored) != `"0123456789abcdef"` {
		t.Errorf("stored %q %v %v, want the whole result", stored, ok, err)
	}
	for name, reply := range map[string]tool.Outcome{"small": {Data: []byte(`"tiny"`)}, "error": failing(tool.ToolFailed),
		"over the limit": {Data: []byte(strings.Repeat("x", 101))}} {
		next := &answering{reply: reply}
		c := b.policyCall(1, def)
		if got := p.intercept(context.Background(), c, next.next); string(got.Data) != string(reply.Data) || c.Res.ClaimCheck != "" {
			t.Errorf("%s: became %.40s, claim check %q; want it unchanged", name, got.Data, c.Res.ClaimCheck)
		}
	}
}

// TestBudgetPolicy: calls are admitted in order until the run's budget is
// spent, and the refusal says which budget; a call that ran adds its time
// and result size to the drive's budget; under stop the drive ends after
// the batch; a tool's own budget refuses its calls only.
func TestBudgetPolicy(t *testing.T) {
	e := policyExecutor(Config{RunBudget: RunBudget{MaxCalls: 2, MaxToolTime: time.Hour, Stop: true}})
	p := &budgets{e: e}
	b := newTestBatch()
	def := &registry.Tool{Name: "t"}
	calls := []*callIn{b.policyCall(0, def), b.policyCall(1, def), b.policyCall(2, def)}
	for i, in := range calls {
		err := p.admit(in)
		if (err != nil) != (i == 2) || (err != nil && (err.Type != tool.BudgetExceeded || !strings.Contains(err.Message, "at most 2 tool calls"))) {
			t.Errorf("call %d admitted: %+v", i, err)
		}
	}
	slow := func(context.Context, *callIn) answer {
		time.Sleep(5 * time.Millisecond)
		return answer{Outcome: tool.Outcome{Data: []byte("12345")}}
	}
	p.intercept(context.Background(), calls[0], slow)
	if spent := p.of(&b.drive); spent.toolTime < 5*time.Millisecond || spent.resultBytes != 5 {
		t.Errorf("spent %s and %d bytes, want at least 5ms and 5", spent.toolTime, spent.resultBytes)
	}
	if status, why := p.stops(&b.drive); status != StatusBudget || why == "" {
		t.Errorf("after a refusal under stop the drive goes on: %q %q", status, why)
	}
	own := newTestBatch()
	capped := &registry.Tool{Name: "capped", Policies: registry.Policies{MaxCallsPerRun: 1}}
	free := policyExecutor(Config{})
	q := &budgets{e: free}
	if q.admit(own.policyCall(0, capped)) != nil || q.admit(own.policyCall(1, capped)) == nil || q.admit(own.policyCall(2, def)) != nil {
		t.Error("a tool's own budget: want its first call admitted, its second refused, another tool's admitted")
	}
	if status, _ := q.stops(&own.drive); status != "" {
		t.Errorf("under continue the drive stops: %q", status)
	}
}
