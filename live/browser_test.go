package live_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

var update = flag.Bool("update", false, "rewrite the README's pictures of the live view (docs/img) from the browser test")

// screenshot saves the page as a PNG: into docs/img with -update (the
// README shows them), into the test's folder otherwise.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if *update {
		dir = "../docs/img"
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// browser finds Chromium. Where it is missing the test is skipped, saying
// so, unless TSC_TEST_REQUIRE_BROWSER is set (make test sets it, after
// installing Chromium).
func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("TSC_TEST_REQUIRE_BROWSER") != "" {
		t.Fatal("no Chromium found, and TSC_TEST_REQUIRE_BROWSER is set (make browser installs it)")
	}
	t.Skip("no Chromium found: the browser test needs it (make browser installs Debian's chromium)")
	return ""
}

// TestLiveViewInABrowser drives a batch of a gated call, an ungated one
// and a failing one, and opens the live view in headless Chromium with
// the API token: the page lists the pending approval with its arguments;
// a click on Approve releases the call; the run completes, Core has one
// output per call with every Action finalised, and the page's timeline
// shows every call with its outcome. The page opened with the operator's
// token shows the run as well.
func TestLiveViewInABrowser(t *testing.T) {
	chrome := browser(t)
	const token, operator = "ui-token-55c0", "ui-operator-9d21"
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Content: "Let me check.", Calls: []coresim.Call{
			{Tool: "transfer_funds", ArgsJSON: `{"from": "ops", "to": "acme-supplies", "amount_eur": 1250}`},
			{Tool: "lookup_invoice", ArgsJSON: `{"invoice": "INV-2041"}`},
			{Tool: "lookup_invoice", ArgsJSON: `{"invoice": "INV-2042"}`},
			{Tool: "notify_slack", ArgsJSON: `{"channel": "#finance"}`}}},
		{Content: "Done: {{results}}"}}}
	// Traced, with the runs linked to a tracing backend.
	const traceID = "5b8efff798038103d269b633813fc60c"
	traced := testenv.Traced(t)
	env := testenv.Start(t, sc, testenv.Options{Token: token, Operator: operator, Config: func(c *config.Config) {
		traced(c)
		c.Server.UITraceURL = "https://traces.example/trace/{trace_id}"
	}},
		testenv.Tool{Config: config.Tool{Name: "transfer_funds", SideEffects: config.Unsafe, Approval: config.ApprovalRequired},
			Handler: testenv.Delayed(150*time.Millisecond, testenv.Echo)},
		testenv.Tool{Config: config.Tool{Name: "lookup_invoice"}, Handler: testenv.Delayed(80*time.Millisecond, testenv.Echo)},
		testenv.Tool{Config: config.Tool{Name: "notify_slack"}, Handler: testenv.Delayed(40*time.Millisecond, func(context.Context, *tool.Call) ([]byte, error) {
			return nil, tool.NewError(tool.ToolFailed, "slack webhook answered 503")
		})})
	r := env.NewRun()
	done := make(chan executor.Summary, 1)
	go func() {
		_, s := testenv.Drive(t, env.URL, r, map[string]string{"Authorization": "Bearer " + token, "traceparent": "00-" + traceID + "-eee19b7ec3c1b174-01"})
		done <- s
	}()

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900))...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(env.URL+"/ui#token="+token)); err != nil {
		t.Fatal(err)
	}
	step, stepCancel := context.WithTimeout(ctx, 90*time.Second) // a guard: the whole walk takes 2-3 s on a quiet machine, 31 s once under a double test load
	defer stepCancel()
	args, err := chromedp.Run(step, chromedp.Text(chromedp.CSS(".approval pre")))
	if err != nil {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		body, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
		t.Fatalf("no approval card: %v\n%s", err, body)
	}
	if want := `"amount_eur": 1250`; !strings.Contains(args, want) {
		t.Errorf("the approval card shows %q, want the arguments with %s", args, want)
	}
	if err := chromedp.Do(step,
		chromedp.SendKeys(chromedp.CSS("#approver"), "ana"),
		chromedp.SendKeys(chromedp.CSS(".approval input"), "invoice checked"),
	); err != nil {
		t.Fatal(err)
	}
	screenshot(t, step, "live-view-approval.png")
	if err := chromedp.Do(step,
		chromedp.Click(chromedp.CSS(".approval button.approve")),
		chromedp.WaitVisible(chromedp.CSS(`#runs tr[data-run-id="`+r.RunID+`"] .status.completed`)),
	); err != nil {
		t.Fatalf("approving in the page: %v", err)
	}
	var sum executor.Summary
	select {
	case sum = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the drive did not end after the click")
	}
	if sum.Status != executor.StatusCompleted || sum.Calls[0].Approval == nil || sum.Calls[0].Approval.Approver != "ana" ||
		sum.Calls[0].Approval.Reason != "invoice checked" || !sum.Calls[0].OK {
		t.Fatalf("summary %+v", sum)
	}
	env.AssertWholeBatches(r, 4)

	// The timeline of turn 1: one row per call, in call order, each with
	// its outcome and a bar from dispatch to reply.
	type row struct {
		Action, Outcome, Marks string
		Bars                   int
	}
	rows, err := chromedp.Run(step, chromedp.Evaluate[[]row](`[...document.querySelectorAll('.turn[data-turn="1"] .row.call')].map(e => ({
		Action: e.dataset.actionId, Outcome: e.dataset.outcome, Marks: e.querySelector('.marks').textContent,
		Bars: e.querySelectorAll('.seg.run').length}))`))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome := []string{"ok", "ok", "ok", "tool_error"}
	if len(rows) != len(sum.Calls) {
		t.Fatalf("the timeline shows %d calls, want %d: %+v", len(rows), len(sum.Calls), rows)
	}
	for i, c := range sum.Calls {
		if rows[i].Action != c.ActionID || rows[i].Outcome != wantOutcome[i] || rows[i].Bars != 1 {
			t.Errorf("timeline row %d %+v, want action %s with outcome %s and one bar", i, rows[i], c.ActionID, wantOutcome[i])
		}
	}
	if !strings.Contains(rows[0].Marks, "approved by ana") {
		t.Errorf("the gated call's marks %q, want approved by ana", rows[0].Marks)
	}

	// The turn has a time axis from 0 to its span; the answer turn, which
	// made no call, is one line; the run's start has its date and zone.
	type view struct {
		Ticks                  []string
		Answer, Started, Trace string
		AnswerRows             int
		AnswerIsOneLine        bool
	}
	v, err := chromedp.Run(step, chromedp.Evaluate[view](`({
		Ticks: [...document.querySelectorAll('.turn[data-turn="1"] .axis .tick')].map(e => e.textContent),
		Answer: document.querySelector('.turn[data-turn="2"] h3').textContent,
		AnswerRows: document.querySelectorAll('.turn[data-turn="2"] .row').length,
		AnswerIsOneLine: document.querySelector('.turn[data-turn="2"]').classList.contains('answer'),
		Started: document.querySelector('#runs tr[data-run-id="`+r.RunID+`"] td:nth-child(6)').textContent,
		Trace: document.getElementById('detail-trace').hidden ? "" : document.getElementById('detail-trace').href})`))
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Ticks) != 5 || v.Ticks[0] != "0 ms" || v.Ticks[4] == "0 ms" {
		t.Errorf("turn 1's axis ticks %q, want 5 from 0 ms to the turn's span", v.Ticks)
	}
	if want := "https://traces.example/trace/" + traceID; v.Trace != want {
		t.Errorf("the run's trace link %q, want %q", v.Trace, want)
	}
	if !v.AnswerIsOneLine || v.AnswerRows != 0 || !strings.Contains(v.Answer, "answer, no tool calls") {
		t.Errorf("the answer turn: %q with %d rows (one line: %v)", v.Answer, v.AnswerRows, v.AnswerIsOneLine)
	}
	if year := fmt.Sprint(time.Now().Year()); !strings.Contains(v.Started, year) || !strings.ContainsAny(v.Started, "+-") && !strings.Contains(v.Started, "UTC") {
		t.Errorf("the run's start reads %q, want its date (%s) and zone", v.Started, year)
	}

	// A click on a call shows its details: the error it ended with, and
	// each step's time; a second click hides them.
	failing := `.turn[data-turn="1"] .row.call[data-action-id="` + sum.Calls[3].ActionID + `"]`
	detail := `.details[data-action-id="` + sum.Calls[3].ActionID + `"]`
	if err := chromedp.Do(step, chromedp.Click(chromedp.CSS(failing)), chromedp.WaitVisible(chromedp.CSS(detail))); err != nil {
		t.Fatalf("clicking a call: %v", err)
	}
	text, err := chromedp.Run(step, chromedp.Text(chromedp.CSS(detail)))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"slack webhook answered 503", "final status", sum.Calls[3].ToolCallID} {
		if !strings.Contains(text, want) {
			t.Errorf("the call's details %q lack %q", text, want)
		}
	}
	screenshot(t, step, "live-view.png")
	if err := chromedp.Do(step, chromedp.Click(chromedp.CSS(failing)), chromedp.WaitNotPresent(chromedp.CSS(detail))); err != nil {
		t.Fatalf("a second click did not hide the details: %v", err)
	}

	// The operator's token, in a tab of its own, shows the run too.
	tab, closeTab := chromedp.NewContext(step)
	defer closeTab()
	if err := chromedp.Do(tab, chromedp.Navigate(env.URL+"/ui#token="+operator),
		chromedp.WaitVisible(chromedp.CSS(`#runs tr[data-run-id="`+r.RunID+`"] .status.completed`))); err != nil {
		t.Fatalf("the page with the operator's token: %v", err)
	}
}
