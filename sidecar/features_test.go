package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// The features no other tool executor offers (docs/tools.md),
// each driven through coresim and real workers and asserted on the wire.

// batchOf is a scenario of one batch of calls, then a final answer.
func batchOf(calls ...string) coresim.Scenario {
	var cs []coresim.Call
	for i, name := range calls {
		cs = append(cs, coresim.Call{Tool: name, ArgsJSON: `{"n": ` + string(rune('0'+i)) + `}`})
	}
	return coresim.Scenario{Turns: []coresim.Turn{{Calls: cs}, {Content: "{{results}}"}}}
}

// toolMessages is what Core received, by tool_call_id order of the batch:
// each call's tool message as decoded JSON (or its text).
func toolMessages(t *testing.T, env *testenv.Env, r testenv.Run) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range env.Sim.ToolMessages(r.ThreadID) {
		var v map[string]any
		if json.Unmarshal([]byte(m.Content), &v) != nil {
			v = map[string]any{"text": m.Content}
		}
		out = append(out, v)
	}
	return out
}

// TestLanes: create_file and write_file share the lane "files"; search has
// none. write_file starts only once create_file has returned, while search
// runs at the same time as create_file (create_file waits for it to start:
// were the batch sequential, that wait would fail). Outcomes reach Core in
// call order.
func TestLanes(t *testing.T) {
	var created, searching atomic.Bool
	var order []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	searchStarted := make(chan struct{})
	env := testenv.Start(t, batchOf("create_file", "search", "write_file"), testenv.Options{},
		testenv.Tool{Config: config.Tool{Name: "create_file", Lane: "files"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			note("create_file")
			select {
			case <-searchStarted:
			case <-time.After(10 * time.Second):
				return nil, errors.New("search never ran beside create_file")
			}
			created.Store(true)
			return []byte(`"created"`), nil
		}},
		testenv.Tool{Config: config.Tool{Name: "write_file", Lane: "files"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			note("write_file")
			if !created.Load() {
				return nil, errors.New("write_file ran before create_file returned")
			}
			return []byte(`"written"`), nil
		}},
		testenv.Tool{Config: config.Tool{Name: "search"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			note("search")
			if searching.CompareAndSwap(false, true) {
				close(searchStarted)
			}
			return []byte(`"found"`), nil
		}})
	r := env.NewRun()
	code, sum := driveHTTP(t, env, r)
	if code != 200 || sum.Status != "completed" {
		t.Fatalf("drive: %d %+v", code, sum)
	}
	for _, c := range sum.Calls {
		if !c.OK {
			t.Errorf("call %s: %s %s", c.Tool, c.ErrorType, c.Error)
		}
		if want := map[string]string{"create_file": "files", "write_file": "files"}[c.Tool]; c.Lane != want {
			t.Errorf("call %s reported lane %q, want %q", c.Tool, c.Lane, want)
		}
	}
	env.AssertWholeBatches(r, 3)
	msgs := toolMessages(t, env, r)
	if msgs[0]["text"] != `"created"` || msgs[1]["text"] != `"found"` || msgs[2]["text"] != `"written"` {
		t.Errorf("tool messages %v, want call order", msgs)
	}
	if strings.Join(order, ",") == "create_file,write_file,search" {
		t.Errorf("order at the workers %v: search waited for the lane", order)
	}
}

// TestLaneSkipRest: in a lane with on_error skip_rest, a failed call stops
// the rest of its lane: the next call gets a "skipped" outcome naming the
// failure and never reaches a worker, while the call outside the lane runs.
func TestLaneSkipRest(t *testing.T) {
	var wrote atomic.Int32
	env := testenv.Start(t, batchOf("create_file", "search", "write_file"),
		testenv.Options{Executor: config.Executor{Lanes: map[string]config.Lane{"files": {OnError: config.LaneSkipRest}}}},
		testenv.Tool{Config: config.Tool{Name: "create_file", Lane: "files"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			return nil, tool.NewError(tool.ToolFailed, "disk full")
		}},
		testenv.Tool{Config: config.Tool{Name: "write_file", Lane: "files"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			wrote.Add(1)
			return []byte(`"written"`), nil
		}},
		testenv.Tool{Config: config.Tool{Name: "search"}, Handler: testenv.Echo})
	r := env.NewRun()
	if code, sum := driveHTTP(t, env, r); code != 200 || sum.Status != "completed" {
		t.Fatalf("drive: %d %+v", code, sum)
	}
	acts := env.AssertWholeBatches(r, 3)
	msgs := toolMessages(t, env, r)
	if msgs[0]["error_type"] != "tool_error" || msgs[2]["error_type"] != "skipped" ||
		!strings.Contains(msgs[2]["error"].(string), `lane "files" failed with tool_error`) {
		t.Errorf("tool messages %v: want create_file's error, then write_file skipped saying why", msgs)
	}
	if _, failed := msgs[1]["error"]; failed {
		t.Errorf("search, outside the lane, failed: %v", msgs[1])
	}
	if wrote.Load() != 0 || acts[2].Status != "failed" {
		t.Errorf("write_file ran %d times, action %s", wrote.Load(), acts[2].Status)
	}
}

// TestBudgets: a call past a budget is not dispatched; its outcome is a
// budget_exceeded error naming the budget and what is left, and the
// summary reports the spending. Under on_budget stop the drive ends after
// the batch instead of asking for another turn.
func TestBudgets(t *testing.T) {
	t.Run("run calls, continue", func(t *testing.T) {
		var ran atomic.Int32
		count := func(ctx context.Context, c *tool.Call) ([]byte, error) { ran.Add(1); return []byte(`"ok"`), nil }
		env := testenv.Start(t, batchOf("a", "a", "a"), testenv.Options{Executor: config.Executor{RunBudget: config.RunBudget{MaxCalls: 2}}},
			testenv.Tool{Config: config.Tool{Name: "a"}, Handler: count})
		r := env.NewRun()
		code, sum := driveHTTP(t, env, r)
		if code != 200 || sum.Status != "completed" || sum.Turns != 2 {
			t.Fatalf("drive: %d %+v", code, sum)
		}
		env.AssertWholeBatches(r, 3)
		msgs := toolMessages(t, env, r)
		if msgs[2]["error_type"] != "budget_exceeded" || !strings.Contains(msgs[2]["error"].(string), "at most 2 tool calls per run; 2 made, none left") {
			t.Errorf("third call's message %v", msgs[2])
		}
		b := sum.Budget
		if ran.Load() != 2 || b == nil || b.Calls != 2 || b.MaxCalls != 2 || b.Refused != 1 || b.ToolCalls["a"] != 2 {
			t.Errorf("worker ran %d calls; budget report %+v", ran.Load(), b)
		}
	})
	t.Run("tool calls per run, stop", func(t *testing.T) {
		env := testenv.Start(t, batchOf("b", "b"), testenv.Options{Executor: config.Executor{RunBudget: config.RunBudget{OnBudget: config.OnBudgetStop}}},
			testenv.Tool{Config: config.Tool{Name: "b", MaxCallsPerRun: 1}, Handler: testenv.Echo})
		r := env.NewRun()
		code, sum := driveHTTP(t, env, r)
		if code != 200 || sum.Status != "budget_exceeded" || sum.Turns != 1 {
			t.Fatalf("drive: %d %+v, want budget_exceeded after 1 turn", code, sum)
		}
		if n := env.Sim.CountRequests("POST", "/v1/completions"); n != 1 {
			t.Errorf("%d completions requests: the stopped run asked for another turn", n)
		}
		env.AssertWholeBatches(r, 2)
		if msgs := toolMessages(t, env, r); msgs[1]["error_type"] != "budget_exceeded" ||
			!strings.Contains(msgs[1]["error"].(string), "b may be called 1 times per run") {
			t.Errorf("second call's message %v", msgs[1])
		}
	})
	t.Run("run result bytes, across turns", func(t *testing.T) {
		sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "d", ArgsJSON: `{}`}}},
			{Calls: []coresim.Call{{Tool: "d", ArgsJSON: `{}`}}}, {Content: "{{results}}"}}}
		big := []byte(`"` + strings.Repeat("x", 98) + `"`)
		env := testenv.Start(t, sc, testenv.Options{Executor: config.Executor{RunBudget: config.RunBudget{MaxResultBytes: 50}}},
			testenv.Tool{Config: config.Tool{Name: "d"}, Handler: func(context.Context, *tool.Call) ([]byte, error) { return big, nil }})
		r := env.NewRun()
		code, sum := driveHTTP(t, env, r)
		if code != 200 || sum.Status != "completed" || sum.Turns != 3 {
			t.Fatalf("drive: %d %+v", code, sum)
		}
		if msgs := toolMessages(t, env, r); msgs[1]["error_type"] != "budget_exceeded" ||
			!strings.Contains(msgs[1]["error"].(string), "at most 50 bytes of tool results per run; 100 returned, none left") {
			t.Errorf("second turn's message %v", msgs[1])
		}
		if b := sum.Budget; b == nil || b.ResultBytes != 100 || b.MaxResultBytes != 50 {
			t.Errorf("budget report %+v", b)
		}
	})
	t.Run("tool rate across runs", func(t *testing.T) {
		env := testenv.Start(t, batchOf("c", "c"), testenv.Options{},
			testenv.Tool{Config: config.Tool{Name: "c", Rate: 0.01, RateBurst: 1}, Handler: testenv.Echo})
		r := env.NewRun()
		if code, sum := driveHTTP(t, env, r); code != 200 || sum.Status != "completed" || sum.Budget == nil || sum.Budget.Refused != 1 {
			t.Fatalf("drive: %d %+v", code, sum)
		}
		if msgs := toolMessages(t, env, r); msgs[1]["error_type"] != "budget_exceeded" ||
			!strings.Contains(msgs[1]["error"].(string), "c is called at most 0.01 times per second across all runs") {
			t.Errorf("second call's message %v", msgs[1])
		}
		// The bucket is the sidecar's, not the run's: another run finds it empty.
		r2 := env.NewRun()
		if _, sum := driveHTTP(t, env, r2); sum.Budget == nil || sum.Budget.Refused != 2 {
			t.Errorf("second run: %+v, want both calls refused by the shared rate", sum.Budget)
		}
		refused, _ := metric(t, env.Sidecar, "toolsidecar_budget_exceeded_total", "budget=tool_rate")
		calls, _ := metric(t, env.Sidecar, "toolsidecar_calls_total", "tool=c", "outcome=budget_exceeded")
		if refused != 3 || calls != 3 {
			t.Errorf("metrics: %v refusals by tool_rate, %v budget_exceeded calls of c; want 3 of each", refused, calls)
		}
	})
}

// TestDedupe: the model repeats a read_only call in a later turn, with the
// same arguments in another key order and a new tool_call_id. With dedupe:
// run the repeat is answered from the first call's result without reaching
// a worker; its output is still submitted for its own tool_call_id, and
// the summary says which call served it. Both memos: the durable ledger's
// bucket and the one in memory.
func TestDedupe(t *testing.T) {
	for _, durable := range []bool{true, false} {
		t.Run(map[bool]string{true: "durable", false: "in memory"}[durable], func(t *testing.T) {
			sc := coresim.Scenario{Turns: []coresim.Turn{
				{Calls: []coresim.Call{{Tool: "search", ArgsJSON: `{"q": "x", "n": 1}`}}},
				{Calls: []coresim.Call{{Tool: "search", ArgsJSON: `{"n": 1, "q": "x"}`}, {Tool: "search", ArgsJSON: `{"q": "y", "n": 1}`}}},
				{Content: "{{results}}"}}}
			var served atomic.Int32
			var mu sync.Mutex
			seen := map[string]int{}
			env := testenv.Start(t, sc, testenv.Options{Config: func(c *config.Config) { c.Durability.Enabled = durable }},
				testenv.Tool{Config: config.Tool{Name: "search", Dedupe: config.DedupeRun, DedupeTTL: time.Minute},
					Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
						var a struct{ Q string }
						json.Unmarshal(c.Args, &a)
						mu.Lock()
						seen[a.Q]++
						mu.Unlock()
						return fmt.Appendf(nil, `{"q": %q, "served": %d}`, a.Q, served.Add(1)), nil
					}})
			r := env.NewRun()
			code, sum := driveHTTP(t, env, r)
			if code != 200 || sum.Status != "completed" || len(sum.Calls) != 3 {
				t.Fatalf("drive: %d %+v", code, sum)
			}
			if seen["x"] != 1 || seen["y"] != 1 {
				t.Errorf("the worker saw %v: want x once (its repeat deduplicated) and y once", seen)
			}
			env.AssertWholeBatches(r, 3)
			msgs := env.Sim.ToolMessages(r.ThreadID)
			if msgs[1].Content != msgs[0].Content || msgs[2].Content == msgs[0].Content {
				t.Errorf("tool messages %q, %q, %q: want the repeat to carry the first result", msgs[0].Content, msgs[1].Content, msgs[2].Content)
			}
			if sum.Calls[1].DedupedFrom != sum.Calls[0].ToolCallID || sum.Calls[1].ToolCallID == sum.Calls[0].ToolCallID || sum.Calls[2].DedupedFrom != "" {
				t.Errorf("summary calls %+v: want the repeat marked deduped from the first", sum.Calls)
			}
			if n, _ := metric(t, env.Sidecar, "toolsidecar_calls_deduped_total", "tool=search"); n != 1 {
				t.Errorf("calls_deduped_total %v, want 1", n)
			}
		})
	}
}

// TestHedging: a read_only tool's attempt still unanswered after
// hedge_after is sent again as the next attempt; the copy answers first and
// wins, and the straggler is cancelled on the cancel subject (its handler
// sees the sidecar's cancellation). Both copies reached the worker pool.
func TestHedging(t *testing.T) {
	var deliveries atomic.Int32
	cancelled := make(chan error, 1)
	env := testenv.Start(t, batchOf("lookup"), testenv.Options{},
		testenv.Tool{Config: config.Tool{Name: "lookup", HedgeAfter: "100ms", Retries: 1},
			Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
				deliveries.Add(1)
				if c.Attempt == 1 { // the straggler: stalls until told to stop
					<-ctx.Done()
					cancelled <- context.Cause(ctx)
					return nil, ctx.Err()
				}
				return []byte(`"from the hedge"`), nil
			}})
	r := env.NewRun()
	code, sum := driveHTTP(t, env, r)
	if code != 200 || sum.Status != "completed" {
		t.Fatalf("drive: %d %+v", code, sum)
	}
	env.AssertWholeBatches(r, 1)
	if msgs := env.Sim.ToolMessages(r.ThreadID); msgs[0].Content != `"from the hedge"` {
		t.Errorf("tool message %q, want the hedge's answer", msgs[0].Content)
	}
	if c := sum.Calls[0]; !c.OK || !c.Hedged || c.Attempts != 2 {
		t.Errorf("call %+v: want ok, hedged, 2 attempts", c)
	}
	select {
	case cause := <-cancelled:
		if !errors.Is(cause, worker.ErrCancelledBySidecar) {
			t.Errorf("the straggler stopped for %v, want the sidecar's cancel", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the straggler was never cancelled")
	}
	if deliveries.Load() != 2 {
		t.Errorf("%d deliveries, want the attempt and its hedge", deliveries.Load())
	}
	if n, _ := metric(t, env.Sidecar, "toolsidecar_hedges_total", "tool=lookup", "winner=hedge"); n != 1 {
		t.Errorf("hedges_total{winner=hedge} %v, want 1", n)
	}
}

// TestClaimCheck: a result over claim_check_bytes reaches the model as a
// bounded preview with its size and a handle; in the next turn the model
// calls the built-in read_tool_result, which the sidecar answers itself
// (no worker sees it) with the page asked for, and the tools list offers
// it. Both stores: the durable ledger's object store and memory.
func TestClaimCheck(t *testing.T) {
	report := make([]byte, 10000)
	for i := range report {
		report[i] = 'a' + byte(i%26)
	}
	for _, durable := range []bool{true, false} {
		t.Run(map[bool]string{true: "durable", false: "in memory"}[durable], func(t *testing.T) {
			sc := coresim.Scenario{Turns: []coresim.Turn{
				{Calls: []coresim.Call{{ID: "call_report", Tool: "report", ArgsJSON: `{}`}}},
				{Calls: []coresim.Call{{Tool: "read_tool_result", ArgsJSON: `{"handle": "call_report", "offset": 500, "length": 1000}`}}},
				{Content: "{{results}}"}}}
			var ran atomic.Int32
			env := testenv.Start(t, sc, testenv.Options{
				Executor: config.Executor{ClaimCheckBytes: 2000, ClaimCheckPreviewBytes: 500},
				Config:   func(c *config.Config) { c.Durability.Enabled = durable }},
				testenv.Tool{Config: config.Tool{Name: "report"}, Handler: func(context.Context, *tool.Call) ([]byte, error) {
					ran.Add(1)
					return report, nil
				}})
			if !slices.Contains(env.Registry.Names(), "read_tool_result") {
				t.Errorf("tools %v lack the built-in read_tool_result", env.Registry.Names())
			}
			r := env.NewRun()
			code, sum := driveHTTP(t, env, r)
			if code != 200 || sum.Status != "completed" || len(sum.Calls) != 2 {
				t.Fatalf("drive: %d %+v", code, sum)
			}
			env.AssertWholeBatches(r, 2)
			msgs := env.Sim.ToolMessages(r.ThreadID)
			var first struct {
				ClaimCheck executor.ClaimCheck `json:"claim_check"`
			}
			if err := json.Unmarshal([]byte(msgs[0].Content), &first); err != nil || len(msgs[0].Content) > 2000 {
				t.Fatalf("first tool message (%d bytes) %.300s: %v", len(msgs[0].Content), msgs[0].Content, err)
			}
			cc := first.ClaimCheck
			if cc.Handle != "call_report" || cc.SizeBytes != 10000 || cc.Preview != string(report[:500]) || sum.Calls[0].ClaimCheck != "call_report" {
				t.Errorf("claim check %+v (summary %q)", cc, sum.Calls[0].ClaimCheck)
			}
			var page struct {
				Offset, Length, SizeBytes int
				Data                      string
				NextOffset                *int `json:"next_offset"`
			}
			if err := json.Unmarshal([]byte(msgs[1].Content), &page); err != nil {
				t.Fatalf("second tool message %.300s: %v", msgs[1].Content, err)
			}
			if page.Data != string(report[500:1500]) || page.NextOffset == nil || *page.NextOffset != 1500 {
				t.Errorf("page %+v: want bytes 500 to 1500 and next_offset 1500", page)
			}
			if ran.Load() != 1 {
				t.Errorf("the worker ran %d calls, want 1: read_tool_result is the sidecar's", ran.Load())
			}
		})
	}
}

// TestClaimCheckStoreLost: the result store is gone (its JetStream bucket
// deleted under the sidecar) when a large result comes back. The result is
// submitted whole instead, as without claim-check: one output for the call,
// its Action finalised, nothing lost.
func TestClaimCheckStoreLost(t *testing.T) {
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), AllowAnonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "report", ArgsJSON: `{}`}}}, {Content: "done"}}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: testenv.APIKey, Scenario: sc})
	defer srv.Close()
	cfg, _ := testenv.Config(t, srv.URL, testenv.Options{Executor: config.Executor{ClaimCheckBytes: 2000, ClaimCheckPreviewBytes: 500}},
		[]testenv.Tool{{Config: config.Tool{Name: "report"}}})
	cfg.NATS.URL = ns.ClientURL()
	s := startOn(t, cfg)
	report := strings.Repeat("0123456789", 1000)
	wnc := natstest.Dial(t, ns.ClientURL())
	natstest.WorkerOn(t, wnc, testenv.Prefix, map[string]tool.Handler{
		"report": func(context.Context, *tool.Call) ([]byte, error) { return []byte(report), nil },
	})
	js, err := jetstream.New(wnc)
	if err != nil {
		t.Fatal(err)
	}
	deleted := 0
	for name := range js.ObjectStoreNames(context.Background()).Name() {
		if strings.HasSuffix(name, "_RESULTS") {
			if err := js.DeleteObjectStore(context.Background(), name); err != nil {
				t.Fatal(err)
			}
			deleted++
		}
	}
	if deleted != 1 {
		t.Fatalf("deleted %d result stores, want the sidecar's one", deleted)
	}
	cc, _ := core.New(core.Config{URL: srv.URL, APIKey: testenv.APIKey})
	r := testenv.SetUpRun(t, cc, nil)
	sum, err := s.Drive(context.Background(), testenv.Request(r), nil)
	if err != nil || sum.Status != "completed" || len(sum.Calls) != 1 {
		t.Fatalf("drive: %+v %v", sum, err)
	}
	if c := sum.Calls[0]; !c.OK || c.ClaimCheck != "" {
		t.Errorf("call %+v: want ok, not claim-checked", c)
	}
	testenv.AssertWholeBatches(t, sim, r, 1)
	if msgs := sim.ToolMessages(r.ThreadID); msgs[0].Content != report {
		t.Errorf("tool message of %d bytes, want the whole %d-byte result", len(msgs[0].Content), len(report))
	}
}
