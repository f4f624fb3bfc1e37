package sidecar_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestApprovalsBelongToTheirCaller: caller A (its own Core key) drives a
// run whose pay call waits for approval. Caller B (another key), and a
// request with the API token alone, neither list it (its arguments are
// A's) nor decide it (404, as for none); the operator's token lists it;
// A approves it, and pay runs once. (#75 item 3)
func TestApprovalsBelongToTheirCaller(t *testing.T) {
	const operator = "operator-token"
	sc := coresim.Scenario{Turns: []coresim.Turn{{Calls: []coresim.Call{{Tool: "pay", ArgsJSON: `{"iban":"DE89-SECRET-OF-A","amount":5000}`}}},
		{Content: "{{results}}"}}}
	a := startApprovalEnv(t, sc, 30*time.Second, testenv.Options{PerKeyUsers: true, Token: approvalToken, Operator: operator})
	as := func(key, bearer string) http.Header {
		h := http.Header{"Authorization": {"Bearer " + bearer}}
		if key != "" {
			h.Set("X-API-Key", key)
		}
		return h
	}
	callerA, callerB, tokenOnly, op := as(testenv.APIKey, approvalToken), as("key-B", approvalToken), as("", approvalToken), as("", operator)

	done := make(chan executor.Summary, 1)
	go func() {
		_, s := testenv.Drive(t, a.URL, a.NewRun(), map[string]string{"X-API-Key": testenv.APIKey, "Authorization": "Bearer " + approvalToken})
		done <- s
	}()
	var list struct{ Approvals []approval.Entry }
	poll.Until(t, "A's approval pending, as A lists them", func() bool {
		return a.apiAs(t, callerA, "GET", "/v1/approvals", nil, &list) == http.StatusOK && len(list.Approvals) == 1
	})
	id := list.Approvals[0].ActionID

	for name, h := range map[string]http.Header{"caller B": callerB, "the API token alone": tokenOnly} {
		var other struct{ Approvals []approval.Entry }
		if code := a.apiAs(t, h, "GET", "/v1/approvals", nil, &other); code != http.StatusOK || other.Approvals == nil || len(other.Approvals) != 0 {
			t.Errorf("%s lists %d %+v, want 200 and none of A's", name, code, other.Approvals)
		}
		if code := a.apiAs(t, h, "POST", "/v1/approvals/"+id, map[string]string{"decision": "approve", "approver": "mallory"}, nil); code != http.StatusNotFound {
			t.Errorf("%s approving A's call answered %d, want 404", name, code)
		}
	}
	var all struct{ Approvals []approval.Entry }
	if code := a.apiAs(t, op, "GET", "/v1/approvals", nil, &all); code != http.StatusOK || len(all.Approvals) != 1 || all.Approvals[0].ActionID != id {
		t.Errorf("the operator lists %d %+v, want A's approval", code, all.Approvals)
	}
	if a.pays.Load() != 0 {
		t.Fatalf("pay ran %d times before A decided", a.pays.Load())
	}
	if code := a.apiAs(t, callerA, "POST", "/v1/approvals/"+id, map[string]string{"decision": "approve", "approver": "ana"}, nil); code != http.StatusOK {
		t.Fatalf("A approving its own call answered %d, want 200", code)
	}
	sum := <-done
	if pay := callOf(sum, "pay"); !pay.OK || pay.Approval == nil || pay.Approval.Approver != "ana" || a.pays.Load() != 1 {
		t.Errorf("pay %+v ran %d times, want once, approved by ana", pay, a.pays.Load())
	}
}
