package executor

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// Each policy is tested alone here: a call of its own, and a next step
// that counts its calls and answers as the test says. The whole chain is
// tested end to end with the loop (loop_test.go, features of the sidecar).

// policyExecutor is an executor with the bounds a policy reads.
func policyExecutor(cfg config.Executor) *Executor {
	if cfg.MaxResultBytes == 0 {
		cfg.MaxResultBytes = 1 << 20
	}
	return &Executor{cfg: cfg, obs: nopObserver{}, memo: newMemMemo(1 << 20), results: memResults{newMemMemo(1 << 20)}}
}

// policyCall is call i of a batch, to tool def.
func policyCall(e *Executor, br *batchRun, i int, def *registry.Tool) *call {
	id := string(rune('a' + i))
	m := &ToolCall{RunID: "run_1", ActionID: "act_" + id, ToolCallID: "call_" + id, Tool: def.Name, Args: json.RawMessage(`{"q": "x"}`)}
	return &call{e: e, b: br, m: m, def: def, ran: make(chan struct{})}
}

// answering is a next step that answers reply and counts its calls.
type answering struct {
	reply tool.Outcome
	calls int
}

func (a *answering) next(context.Context, *call, *outcome) tool.Outcome {
	a.calls++
	return a.reply
}

func failing(typ tool.ErrorType) tool.Outcome {
	return tool.Outcome{Err: tool.NewError(typ, "it failed")}
}

// TestLanePolicy: under skip_rest, the call after a failed one in its lane
// is skipped without being dispatched, saying why; a call of no lane, and
// a lane that continues, pass straight on.
func TestLanePolicy(t *testing.T) {
	e := policyExecutor(config.Executor{Lanes: map[string]config.Lane{"db": {OnError: config.LaneSkipRest}, "log": {}}})
	br := &batchRun{e: e, log: slog.New(slog.DiscardHandler), lanes: map[string]*lane{}}
	def := &registry.Tool{Name: "write", Config: config.Tool{Lane: "db"}}
	first, second := policyCall(e, br, 0, def), policyCall(e, br, 1, def)
	br.lane("db").join(first)
	br.lane("db").join(second)
	if second.laneBefore != (<-chan struct{})(first.ran) {
		t.Fatal("the second call of the lane does not wait for the first")
	}
	fail := &answering{reply: failing(tool.ToolFailed)}
	if got := e.inLane(fail.next)(context.Background(), first, newOutcome(1, first.m)); got.Err == nil || fail.calls != 1 {
		t.Fatalf("first call: %+v after %d dispatches", got, fail.calls)
	}
	close(first.ran)
	ok := &answering{reply: tool.Outcome{Data: []byte("ok")}}
	got := e.inLane(ok.next)(context.Background(), second, newOutcome(1, second.m))
	if got.Err == nil || got.Err.Type != tool.Skipped || ok.calls != 0 || !strings.Contains(got.Err.Message, "call_a (write)") {
		t.Errorf("the call after a failure: %+v after %d dispatches; want skipped, naming the failed call", got.Err, ok.calls)
	}
	for _, c := range []*call{policyCall(e, br, 2, &registry.Tool{Name: "free"}), policyCall(e, br, 3, &registry.Tool{Name: "note", Config: config.Tool{Lane: "log"}})} {
		if c.def.Config.Lane != "" {
			br.lane(c.def.Config.Lane).join(c)
		}
		ok.calls = 0
		if got := e.inLane(ok.next)(context.Background(), c, newOutcome(1, c.m)); got.Err != nil || ok.calls != 1 {
			t.Errorf("%s: %+v after %d dispatches, want it dispatched", c.m.Tool, got.Err, ok.calls)
		}
	}
}

// TestLanePolicyCancelled: a call waiting for its lane ends with the run.
func TestLanePolicyCancelled(t *testing.T) {
	e := policyExecutor(config.Executor{})
	br := &batchRun{e: e, log: slog.New(slog.DiscardHandler), lanes: map[string]*lane{}}
	def := &registry.Tool{Name: "write", Config: config.Tool{Lane: "db"}}
	first, second := policyCall(e, br, 0, def), policyCall(e, br, 1, def)
	br.lane("db").join(first)
	br.lane("db").join(second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ok := &answering{}
	if got := e.inLane(ok.next)(ctx, second, newOutcome(1, second.m)); got.Err == nil || got.Err.Type != tool.Cancelled || ok.calls != 0 {
		t.Errorf("%+v after %d dispatches, want cancelled", got.Err, ok.calls)
	}
}

// TestDedupePolicy: the first call of a dedupe tool is dispatched and its
// result remembered; an identical call of the run is answered from it
// without a dispatch, naming the call it came from; a failure is not
// remembered; a tool without dedupe is always dispatched.
func TestDedupePolicy(t *testing.T) {
	e := policyExecutor(config.Executor{})
	br := &batchRun{e: e, log: slog.New(slog.DiscardHandler)}
	def := &registry.Tool{Name: "search", Config: config.Tool{Dedupe: config.DedupeRun}}
	next := &answering{reply: tool.Outcome{Data: []byte(`"found"`)}}
	first := policyCall(e, br, 0, def)
	if got := e.dedupe(next.next)(context.Background(), first, newOutcome(1, first.m)); string(got.Data) != `"found"` || next.calls != 1 {
		t.Fatalf("first call: %s after %d dispatches", got.Data, next.calls)
	}
	again := policyCall(e, br, 1, def)
	o := newOutcome(1, again.m)
	if got := e.dedupe(next.next)(context.Background(), again, o); string(got.Data) != `"found"` || next.calls != 1 || o.res.DedupedFrom != "call_a" {
		t.Errorf("repeat: %s after %d dispatches, deduped from %q; want the first result, no dispatch, from call_a", got.Data, next.calls, o.res.DedupedFrom)
	}

	failed := &answering{reply: failing(tool.Timeout)}
	other := policyCall(e, br, 2, &registry.Tool{Name: "flaky", Config: config.Tool{Dedupe: config.DedupeRun}})
	e.dedupe(failed.next)(context.Background(), other, newOutcome(1, other.m))
	e.dedupe(failed.next)(context.Background(), other, newOutcome(1, other.m))
	if failed.calls != 2 {
		t.Errorf("a failed result answered a repeat: %d dispatches, want 2", failed.calls)
	}
	plain := policyCall(e, br, 3, &registry.Tool{Name: "plain"})
	next.calls = 0
	e.dedupe(next.next)(context.Background(), plain, newOutcome(1, plain.m))
	e.dedupe(next.next)(context.Background(), plain, newOutcome(1, plain.m))
	if next.calls != 2 {
		t.Errorf("a tool without dedupe: %d dispatches, want 2", next.calls)
	}
}

// TestClaimCheckPolicy: a result over claim_check_bytes is stored and the
// model reads a preview with its handle; a small result, an error, and a
// result over the size limit (which settle turns into an error) pass
// unchanged.
func TestClaimCheckPolicy(t *testing.T) {
	e := policyExecutor(config.Executor{ClaimCheckBytes: 10, ClaimCheckPreviewBytes: 4, MaxResultBytes: 100})
	br := &batchRun{e: e, log: slog.New(slog.DiscardHandler)}
	c := policyCall(e, br, 0, &registry.Tool{Name: "big"})
	big := &answering{reply: tool.Outcome{Data: []byte(`"0123456789abcdef"`)}}
	o := newOutcome(1, c.m)
	got := e.claimChecked(big.next)(context.Background(), c, o)
	var cc map[string]ClaimCheck
	if err := json.Unmarshal(got.Data, &cc); err != nil || cc["claim_check"].Handle != "call_a" || cc["claim_check"].Preview != `"012` || o.res.ClaimCheck != "call_a" {
		t.Fatalf("large result became %s (%v), claim check %q", got.Data, err, o.res.ClaimCheck)
	}
	stored, ok, err := e.results.GetResult(context.Background(), resultName("run_1", "call_a"))
	if err != nil || !ok || string(stored) != `"0123456789abcdef"` {
		t.Errorf("stored %q %v %v, want the whole result", stored, ok, err)
	}
	for name, reply := range map[string]tool.Outcome{"small": {Data: []byte(`"tiny"`)}, "error": failing(tool.ToolFailed),
		"over the limit": {Data: []byte(strings.Repeat("x", 101))}} {
		next := &answering{reply: reply}
		o := newOutcome(1, c.m)
		if got := e.claimChecked(next.next)(context.Background(), c, o); string(got.Data) != string(reply.Data) || o.res.ClaimCheck != "" {
			t.Errorf("%s: became %.40s, claim check %q; want it unchanged", name, got.Data, o.res.ClaimCheck)
		}
	}
}

// TestBudgetPolicy: a call that ran adds its time and result size to the
// run's budget; a run without a budget spends nothing.
func TestBudgetPolicy(t *testing.T) {
	e := policyExecutor(config.Executor{})
	b := newBudget(config.RunBudget{MaxToolTime: time.Hour})
	br := &batchRun{e: e, log: slog.New(slog.DiscardHandler), req: Request{budget: b}}
	c := policyCall(e, br, 0, &registry.Tool{Name: "t"})
	slow := func(context.Context, *call, *outcome) tool.Outcome {
		time.Sleep(5 * time.Millisecond)
		return tool.Outcome{Data: []byte("12345")}
	}
	e.spendBudget(slow)(context.Background(), c, newOutcome(1, c.m))
	if b.toolTime < 5*time.Millisecond || b.resultBytes != 5 {
		t.Errorf("spent %s and %d bytes, want at least 5ms and 5", b.toolTime, b.resultBytes)
	}
	br.req.budget = nil
	next := &answering{reply: tool.Outcome{Data: []byte("x")}}
	if got := e.spendBudget(next.next)(context.Background(), c, newOutcome(1, c.m)); string(got.Data) != "x" || next.calls != 1 {
		t.Errorf("without a budget: %s after %d dispatches", got.Data, next.calls)
	}
}
