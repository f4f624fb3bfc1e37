package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
)

// approve plays the operator who watches the approvals: it lists them on
// the sidecar's API (base) and approves each, as a person would with a
// click in the live view, telling say what it did. stop ends it and waits.
func approve(ctx context.Context, base string, say func(string)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		decided := map[string]bool{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			pending, err := listApprovals(ctx, base)
			if err != nil {
				continue
			}
			for _, p := range pending {
				if decided[p.ActionID] {
					continue
				}
				decided[p.ActionID] = true
				body, _ := json.Marshal(map[string]string{"decision": approval.DecisionApprove, "approver": "demo operator",
					"reason": "deposit within the trip's budget"})
				req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/approvals/"+p.ActionID, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				say(fmt.Sprintf("✓ %-17s %s approved by the demo operator: POST /v1/approvals/%s → %d", p.Tool, p.ToolCallID, p.ActionID, resp.StatusCode))
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

func listApprovals(ctx context.Context, base string) ([]approval.Entry, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/approvals", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list struct{ Approvals []approval.Entry }
	err = json.NewDecoder(resp.Body).Decode(&list)
	return list.Approvals, err
}
