package live_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// attackJS tries, from its own origin, to approve a pending call of the
// sidecar at SIDE and to read the pending approvals, every way a page may
// try: a simple request (text/plain, no preflight), a no-cors request, a
// JSON request (preflighted), a read. It reports what each got.
const attackJS = `async function attack(side, id) {
  const body = JSON.stringify({decision: "approve", approver: "attacker"});
  const out = {};
  const tries = {
    simple: () => fetch(side + "/v1/approvals/" + id, {method: "POST", headers: {"Content-Type": "text/plain"}, body}),
    nocors: () => fetch(side + "/v1/approvals/" + id, {method: "POST", mode: "no-cors", body}),
    json: () => fetch(side + "/v1/approvals/" + id, {method: "POST", headers: {"Content-Type": "application/json"}, body}),
    read: () => fetch(side + "/v1/approvals"),
  };
  for (const [name, f] of Object.entries(tries)) {
    try { const r = await f(); out[name] = r.type === "opaque" ? "opaque" : r.status + " " + (await r.text()); }
    catch (e) { out[name] = "refused: " + e; }
  }
  return out;
}`

var attackerPage = "<!doctype html><script>" + attackJS + "</script>"

// TestForeignPagesRefused: a page served from a second origin, in headless
// Chromium, tries to approve an unsafe call and to read the approvals of a
// sidecar on the shipped default (no token); then a page whose own name
// resolves to 127.0.0.1 (DNS rebinding) tries the same as same-origin
// requests. Every attempt fails: the approval is still pending afterwards,
// and no answer carries its arguments. Before, the text/plain request was
// recorded as an approval and the rebound page read the arguments.
func TestForeignPagesRefused(t *testing.T) {
	chrome := browser(t)
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "transfer_funds", ArgsJSON: `{"to": "mallory", "amount_eur": 9000}`}}},
		{Content: "{{results}}"}}}
	env := testenv.Start(t, sc, testenv.Options{},
		testenv.Tool{Config: config.Tool{Name: "transfer_funds", SideEffects: config.Unsafe, Approval: config.ApprovalRequired}, Handler: testenv.Echo})
	r := env.NewRun()
	done := make(chan executor.Summary, 1)
	go func() { _, s := testenv.Drive(t, env.URL, r, nil); done <- s }()
	pending := func() []approval.Entry {
		var list struct{ Approvals []approval.Entry }
		resp, err := http.Get(env.URL + "/v1/approvals")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(&list)
		return list.Approvals
	}
	var id string
	poll.Until(t, "the approval to be pending", func() bool {
		if ps := pending(); len(ps) == 1 {
			id = ps[0].ActionID
		}
		return id != ""
	})

	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, attackerPage)
	}))
	defer attacker.Close()
	_, port, _ := strings.Cut(strings.TrimPrefix(env.URL, "http://"), ":")
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("host-resolver-rules", "MAP rebound.test 127.0.0.1"))...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, stop := context.WithTimeout(ctx, 60*time.Second)
	defer stop()

	var results []map[string]string
	for _, c := range []struct{ page, side string }{
		{attacker.URL, env.URL},                     // another origin (another port: the same site)
		{"http://rebound.test:" + port + "/ui", ""}, // DNS rebinding: the page's own origin names the sidecar's address
	} {
		script := fmt.Sprintf("(%s)(%q, %q)", attackJS, c.side, id)
		if err := chromedp.Do(ctx, chromedp.Navigate(c.page)); err != nil {
			t.Fatalf("%s: %v", c.page, err)
		}
		out, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](script, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("%s: %v", c.page, err)
		}
		results = append(results, out)
		t.Logf("from %s: %v", c.page, out)
	}
	for i, out := range results {
		for name, got := range out {
			if strings.HasPrefix(got, "200") || strings.Contains(got, "mallory") {
				t.Errorf("attempt %d, %s: %s", i, name, got)
			}
		}
	}
	if ps := pending(); len(ps) != 1 || ps[0].Verdict != nil {
		t.Fatalf("the approval after the attempts: %+v", ps)
	}
	// The operator's own decision still works, and is the one recorded.
	body, _ := json.Marshal(map[string]string{"decision": "deny", "approver": "ana"})
	resp, err := http.Post(env.URL+"/v1/approvals/"+id, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sum := <-done
	if c := sum.Calls[0]; c.OK || c.Approval == nil || c.Approval.Approver != "ana" {
		t.Errorf("the call %+v, approval %+v: want denied by ana", c, c.Approval)
	}
}
