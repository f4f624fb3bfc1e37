package coresim

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/core"
)

// TestSplitWritesAndLatency: with each answer's head and body written
// apart and a random latency on every request, a whole turn and its
// submissions work as without them, and the contract log stays empty.
func TestSplitWritesAndLatency(t *testing.T) {
	f := setupWith(t, Config{Scenario: threeCalls(), SplitWrites: true, MaxLatency: 2 * time.Millisecond})
	ms, _, err := f.turn(t)
	if err != nil || len(ms) != 3 {
		t.Fatalf("%d manifests, %v", len(ms), err)
	}
	for _, m := range ms {
		f.submit(t, m, `"ok"`, true)
	}
	if v := f.sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
	if acts := f.sim.Actions(f.req.RunID); len(acts) != 3 || acts[2].Status != core.ActionCompleted {
		t.Errorf("actions %+v", acts)
	}
}

// TestHoldAppliesLate: a held write takes effect after the hold, though
// its client gave up long before; Holding counts it meanwhile.
func TestHoldAppliesLate(t *testing.T) {
	f := setup(t, threeCalls())
	ms, _, err := f.turn(t)
	if err != nil || len(ms) == 0 {
		t.Fatalf("%d manifests, %v", len(ms), err)
	}
	f.sim.AddFault(Fault{Method: "PUT", Path: "/v1/actions/", Hold: 300 * time.Millisecond})
	c, _ := core.New(core.Config{URL: f.url, APIKey: "k", Timeout: 50 * time.Millisecond, Retries: -1})
	if _, err := c.UpdateAction(context.Background(), ms[0].ActionID, core.ActionUpdate{Status: core.ActionProcessing}); err == nil {
		t.Fatal("the held write was answered within its client's timeout")
	}
	if n := f.sim.Holding(); n != 1 {
		t.Errorf("Holding = %d while the write is held, want 1", n)
	}
	for f.sim.Holding() != 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if a := f.sim.Actions(f.req.RunID)[0]; a.Status != core.ActionProcessing {
		t.Errorf("after the hold the Action is %s, want processing: the write took effect late", a.Status)
	}
}

// TestViolationsEndpoint: the contract log is served at /_sim/violations,
// for a simulator in another process.
func TestViolationsEndpoint(t *testing.T) {
	f := setup(t, threeCalls())
	ms, _, _ := f.turn(t)
	f.post(t, ms[0].ActionID, ms[0].ToolCallID, "x")
	f.post(t, ms[0].ActionID, ms[0].ToolCallID, "again")
	req, _ := http.NewRequest(http.MethodGet, f.url+"/_sim/violations", nil)
	req.Header.Set("X-API-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v []Violation
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || len(v) != 1 || v[0].Kind != ViolationDuplicateOutput || v[0].ToolCallID != ms[0].ToolCallID {
		t.Errorf("served log %+v (%v), want the one duplicate_output", v, err)
	}
}
