package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// pendingApprovals lists the daemon's pending approvals.
func (p *daemonProc) pendingApprovals(t *testing.T) []approval.Entry {
	t.Helper()
	resp, err := http.Get(p.base + "/v1/approvals")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var list struct{ Approvals []approval.Entry }
	_ = json.NewDecoder(resp.Body).Decode(&list)
	return list.Approvals
}

func (p *daemonProc) decide(t *testing.T, actionID, decision string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"decision": decision, "approver": "ops"})
	resp, err := http.Post(p.base+"/v1/approvals/"+actionID, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestApprovalSurvivesSIGKILL: the daemon (durable, the default) is killed
// with SIGKILL while a gated call waits for approval and its sibling has
// run. The restarted daemon lists the same approval (same request time and
// deadline) from JetStream; the run driven again waits on it, and the
// decision taken on the restarted daemon releases it: the gated tool runs
// once, no turn was asked before the decision, and Core has one output per
// call with every Action finalised.
func TestApprovalSurvivesSIGKILL(t *testing.T) { approvalAcrossRestart(t, syscall.SIGKILL) }

// TestApprovalSurvivesSIGTERM: the same with a graceful stop, as a rolling
// update does. The daemon does not wait for the decision (nor for its
// shutdown timeout): the first drive ends interrupted, the gated call's
// Action is still pending and its approval kept, nothing after it in the
// batch was posted out of order, and the daemon exits 0. Then as above.
func TestApprovalSurvivesSIGTERM(t *testing.T) { approvalAcrossRestart(t, syscall.SIGTERM) }

func approvalAcrossRestart(t *testing.T, sig syscall.Signal) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{"amount": 12}`}, {Tool: "look", ArgsJSON: `{}`}}},
		{Content: "answer: {{results}}"}}}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: "k", Scenario: sc})
	defer srv.Close()
	p := newDaemonConfig(t, srv.URL, "  - {name: look, side_effects: read_only, timeout: 10s}\n"+
		"  - {name: pay, side_effects: unsafe, timeout: 10s, approval: required, approval_timeout: 5m}\n")
	p.start(t)
	var looks, pays atomic.Int32
	count := func(n *atomic.Int32) tool.Handler {
		return func(ctx context.Context, c *tool.Call) ([]byte, error) {
			n.Add(1)
			return []byte(`"` + c.Tool + ` done"`), nil
		}
	}
	startWorker(t, p.natsURL, map[string]tool.Handler{"look": count(&looks), "pay": count(&pays)})
	run, msgID := newRun(t, srv.URL)
	first := p.drive(run, msgID)
	var before []approval.Entry
	poll.Until(t, "the approval and the sibling", func() bool {
		before = p.pendingApprovals(t)
		return len(before) == 1 && looks.Load() == 1
	})
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	exit := p.cmd.Wait()
	res := <-first
	switch {
	case sig == syscall.SIGKILL && res.err == nil:
		t.Fatalf("the first drive survived SIGKILL: %+v", res.sum)
	case sig == syscall.SIGTERM:
		if exit != nil || res.err != nil || res.sum.Status != executor.StatusInterrupted {
			t.Fatalf("after SIGTERM the daemon exited with %v and the drive ended %+v %v, want exit 0 and interrupted\n%s", exit, res.sum, res.err, p.stderr.String())
		}
		for _, a := range sim.Actions(run.ID) {
			if a.ToolName == "pay" && a.Status != core.ActionPending {
				t.Errorf("after SIGTERM the gated call's Action is %s, want pending", a.Status)
			}
		}
		if msgs := sim.ToolMessages(run.ThreadID); len(msgs) != 0 {
			t.Errorf("%d tool messages posted before the gated call's, want none (call order)", len(msgs))
		}
	}

	p.start(t)
	after := p.pendingApprovals(t)
	if len(after) != 1 || after[0].ActionID != before[0].ActionID || !after[0].RequestedAt.Equal(before[0].RequestedAt) ||
		!after[0].Deadline.Equal(before[0].Deadline) {
		t.Fatalf("after the restart the daemon lists %+v, want %+v", after, before)
	}
	second := p.drive(run, msgID)
	select {
	case res := <-second:
		t.Fatalf("the drive ended before the decision: %+v %v", res.sum, res.err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := sim.CountRequests("POST", "/v1/completions"); n != 1 {
		t.Errorf("%d completions requests before the decision, want 1", n)
	}
	if code := p.decide(t, after[0].ActionID, "approve"); code != http.StatusOK {
		t.Fatalf("the restarted daemon answered the decision %d\n%s", code, p.stderr.String())
	}
	res = <-second
	if res.err != nil || res.sum.Status != executor.StatusCompleted {
		t.Fatalf("second drive %+v %v\n%s", res.sum, res.err, p.stderr.String())
	}
	var payRes executor.CallResult
	for _, c := range res.sum.Calls {
		if c.Tool == "pay" {
			payRes = c
		}
	}
	if !payRes.OK || payRes.Approval == nil || payRes.Approval.Approver != "ops" || payRes.Approval.AuthenticatedAs != "none" {
		t.Errorf("pay's result %+v", payRes)
	}
	if pays.Load() != 1 {
		t.Errorf("the gated tool ran %d times, want 1", pays.Load())
	}
	testenv.AssertWholeBatches(t, sim, testenv.Run{RunID: run.ID, ThreadID: run.ThreadID}, 2)
	if r, _ := sim.Run(run.ID); r.Status != core.RunCompleted {
		t.Errorf("Core's run is %s", r.Status)
	}
	if code := p.decide(t, after[0].ActionID, "deny"); code != http.StatusConflict {
		t.Errorf("a second decision answered %d, want 409", code)
	}
}
