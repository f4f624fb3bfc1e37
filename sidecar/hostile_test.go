package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// long is an id far past every bound: as a NATS subject or a KV key it
// exceeds the server's control line, and the server closes the connection.
var long = strings.Repeat("a", 5000)

// TestHostileIDsFromCore: Core's manifests carry an action_id of 100,000
// characters, one with '.' and '*', and a tool_call_id of 5,000. Each of
// those calls gets its own invalid_args outcome, which the model reads
// beside its tool_call_id; its sibling runs; the run completes. No such id
// reaches NATS or a URL path: an Action whose id is not an id is left as
// Core has it (docs/applications.md), and the sidecar stays ready and
// drives the next run. The answer quotes no id whole. Before, the long id
// became the ledger's KV subject and cut the sidecar off from NATS for
// good; later, it became the path of PUT /v1/actions/, whose 404 failed
// the whole run with 502, in an answer of 201 KB.
func TestHostileIDsFromCore(t *testing.T) {
	huge := strings.Repeat("a", 100_000)
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{
			{Tool: "echo", ArgsJSON: `{"q": 1}`, ActionID: "act_" + huge},
			{Tool: "echo", ArgsJSON: `{"q": 2}`, ActionID: "act.x.*"},
			{Tool: "echo", ArgsJSON: `{"q": 3}`, ID: "call_" + long},
			{Tool: "echo", ArgsJSON: `{"q": 4}`},
		}},
		{Content: "{{results}}"},
	}}
	env := testenv.New(t, sc, testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	r := env.NewRun()
	_, raw := testenv.DriveRaw(t, env.URL, r, nil)
	if len(raw) > 64<<10 {
		t.Errorf("the drive's answer is %d bytes: it quotes the ids", len(raw))
	}
	var sum executor.Summary
	if err := json.Unmarshal(raw, &sum); err != nil || sum.Status != executor.StatusCompleted || len(sum.Calls) != 4 {
		t.Fatalf("summary %+v %v", sum, err)
	}
	for i, c := range sum.Calls[:3] {
		if c.OK || c.ErrorType != string(tool.InvalidArgs) {
			t.Errorf("call %d: %+v, want an invalid_args outcome", i, c)
		}
		if len(c.Error) > 512 {
			t.Errorf("call %d's error quotes %d bytes of the id", i, len(c.Error))
		}
	}
	for i, c := range sum.Calls {
		if !c.Submitted {
			t.Errorf("call %d's outcome was not submitted", i)
		}
	}
	// The calls with a bad action_id have their Action left as Core has
	// it; the others are finalised.
	for _, a := range env.Sim.Actions(r.RunID) {
		if final := a.Status == "completed" || a.Status == "failed"; final == (tool.CheckID("id", a.ID) != nil) {
			t.Errorf("Action %s is %s", tool.Excerpt(a.ID), a.Status)
		}
	}
	if c := sum.Calls[3]; !c.OK || !c.Submitted {
		t.Errorf("the sibling with sound ids: %+v", c)
	}
	msgs := env.Sim.ToolMessages(r.ThreadID)
	if len(msgs) != 4 {
		t.Fatalf("%d tool messages, want one per call", len(msgs))
	}
	for i, m := range msgs[:2] {
		if m.ToolID != "" || !strings.Contains(m.Content, "action_id") {
			t.Errorf("tool message %d: tool_id %s, content %s: want no tool_id and the call's error", i, tool.Excerpt(m.ToolID), tool.Excerpt(m.Content))
		}
	}
	if !strings.Contains(msgs[2].Content, "tool_call_id must be 1 to 256 characters") {
		t.Errorf("the model read %s", msgs[2].Content)
	}
	for _, req := range env.Sim.Requests() {
		if len(req.Path) > 200 {
			t.Errorf("Core was sent %s %s", req.Method, tool.Excerpt(req.Path))
		}
	}
	assertReady(t, env.URL)
	r2 := env.NewRun() // the next run is driven as usual
	if sum, _ := env.DriveWhole(r2, 4); sum.Status != executor.StatusCompleted || !sum.Calls[3].OK {
		t.Errorf("the next drive %+v", sum)
	}
}

// TestHugeManifest: Core sends a manifest whose arguments are 20 MB among
// three sound ones. It is never read whole: that call gets an invalid_args
// outcome saying how large it was, its siblings run, and the drive
// completes. Before, the stream's reader gave up ("bufio.Scanner: token
// too long") and the whole drive failed with 502.
func TestHugeManifest(t *testing.T) {
	huge := `{"blob": "` + strings.Repeat("z", 20<<20) + `"}`
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "echo", ArgsJSON: `{"q": 1}`}, {Tool: "echo", ArgsJSON: huge}, {Tool: "echo", ArgsJSON: `{"q": 3}`}}},
		{Content: "{{results}}"},
	}}
	env := testenv.New(t, sc, testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	r := env.NewRun()
	sum, msgs := env.DriveWhole(r, 3)
	if sum.Status != executor.StatusCompleted {
		t.Fatalf("summary %+v", sum)
	}
	if c := sum.Calls[1]; c.OK || c.ErrorType != string(tool.InvalidArgs) || !strings.Contains(c.Error, "over the limit") {
		t.Errorf("the huge call: %+v", c)
	}
	if !sum.Calls[0].OK || !sum.Calls[2].OK {
		t.Errorf("siblings %+v %+v", sum.Calls[0], sum.Calls[2])
	}
	if len(msgs[1].Content) > 4<<10 {
		t.Errorf("the model read %d bytes for the huge call", len(msgs[1].Content))
	}
	assertReady(t, env.URL)
}

// TestHostileIDsFromCallers: ids in the path and the body of the API are
// checked before anything is done with them: 400, with an error that
// quotes a short, escaped prefix of what was sent. The sidecar stays
// ready. Before, POST /v1/approvals/<5,000 characters> cut the sidecar off
// from NATS for good, and '.' or '*' answered 503 "nats: invalid key".
func TestHostileIDsFromCallers(t *testing.T) {
	env := testenv.New(t, oneCall("echo"), testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	r := env.NewRun()
	body := func(v any) []byte { b, _ := json.Marshal(v); return b }
	decision := body(map[string]string{"decision": "approve"})
	for _, c := range []struct {
		name, path string
		body       []byte
	}{
		{"long action id", "/v1/approvals/" + long, decision},
		{"action id with dots", "/v1/approvals/act.a.b", decision},
		{"action id with a star", "/v1/approvals/act*", decision},
		{"long run id", "/v1/runs/" + long + "/drive", body(map[string]string{"thread_id": r.ThreadID, "assistant_id": r.AssistantID, "message_id": r.MessageID, "model": "m"})},
		{"long thread id", "/v1/runs/" + r.RunID + "/drive", body(map[string]string{"thread_id": long, "assistant_id": r.AssistantID, "message_id": r.MessageID, "model": "m"})},
		{"control bytes in an id", "/v1/runs/" + r.RunID + "/drive", body(map[string]string{"thread_id": "t\x1b[31m", "assistant_id": r.AssistantID, "message_id": r.MessageID, "model": "m"})},
		{"long proxied run id", "/v1/completions", body(map[string]any{"run_id": long, "thread_id": r.ThreadID, "assistant_id": r.AssistantID, "message_id": r.MessageID, "model": "m", "stream": true})},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", env.URL+c.path, bytes.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var out map[string]string
			_ = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusUnprocessableEntity {
				t.Errorf("%d %v, want 400 (422 in Core's shape)", resp.StatusCode, out)
			}
			if msg := out["error"]; len(msg) > 512 || strings.Contains(msg, strings.Repeat("a", 100)) || strings.Contains(msg, "\x1b") {
				t.Errorf("the error echoes what was sent: %q", msg)
			}
			assertReady(t, env.URL)
		})
	}
	if code, sum := driveHTTP(t, env, r); code != 200 || sum.Status != executor.StatusCompleted {
		t.Errorf("a sound drive after them: %d %+v", code, sum)
	}
}

// assertReady checks that the sidecar is live and ready: its NATS
// connection is up.
func assertReady(t *testing.T, base string) {
	t.Helper()
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := probe(t, base+p); code != http.StatusOK {
			t.Errorf("%s %d %s", p, code, body)
		}
	}
}

// dirBytes is the size of the files under dir.
func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// TestWorkerReplyFlood: a worker credential that serves one tool floods the
// sidecar's reply namespace (which durable mode lets workers publish to)
// with 4 MiB and 1 MiB replies to calls that do not exist, while a run's
// batch is driven. The batch completes as usual; no message past the
// stream's message bound is stored, and the store never grows past
// durability.max_bytes (16 MiB here) and a block of slack.
// TSC_FLOOD_SECONDS sets the flood's length (RELIABILITY.md has 30 s).
// Before, 50 x 4 MiB grew the store by 200 MB for 25 hours.
func TestWorkerReplyFlood(t *testing.T) {
	seconds := 3
	if v, err := strconv.Atoi(os.Getenv("TSC_FLOOD_SECONDS")); err == nil && v > 0 {
		seconds = v
	}
	const bound = 16 << 20
	store := t.TempDir()
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "echo", ArgsJSON: `{"q": 1}`}, {Tool: "echo", ArgsJSON: `{"q": 2}`}, {Tool: "echo", ArgsJSON: `{"q": 3}`}}},
		{Content: "{{results}}"}}}
	env := testenv.Start(t, sc, testenv.Options{
		Workers: []config.Worker{{Name: "mallory", PasswordFile: secretFile(t, "mallory", "mallory-pw"), Tools: []string{"flood"}}},
		NATS:    func(n *config.NATS) { n.Embedded.StoreDir = store },
		Config:  func(c *config.Config) { c.Durability.MaxBytes = bound }},
		testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Delayed(time.Duration(seconds)*time.Second/2, testenv.Echo)},
		testenv.Tool{Config: config.Tool{Name: "flood"}})
	nc, err := nats.Connect(env.NATSURL, nats.UserInfo("mallory", "mallory-pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	before := dirBytes(t, store)
	r := env.NewRun()
	done := make(chan executor.Summary, 1)
	go func() { sum, _ := env.Sidecar.Drive(context.Background(), testenv.Request(r), nil); done <- sum }()
	big, mid := make([]byte, 4<<20), make([]byte, 1<<20)
	var sent, peak int64
	for end := time.Now().Add(time.Duration(seconds) * time.Second); time.Now().Before(end); {
		for _, b := range [][]byte{big, mid} {
			subject := fmt.Sprintf("%s.replies.%s.%d", testenv.Prefix, "pod", sent)
			if err := nc.Publish(subject, b); err != nil {
				t.Fatal(err)
			}
			sent += int64(len(b))
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, dirBytes(t, store)-before)
	}
	sum := <-done
	if sum.Status != executor.StatusCompleted {
		t.Fatalf("the run during the flood: %+v", sum)
	}
	env.AssertWholeBatches(r, 3)
	t.Logf("FIGURE worker_reply_flood seconds=%d sent_mib=%d store_peak_growth_mib=%.1f bound_mib=%d", seconds, sent>>20,
		float64(peak)/(1<<20), bound>>20)
	if peak > bound+4<<20 { // a file block of slack
		t.Errorf("the store grew by %d MiB during the flood, past the bound of %d", peak>>20, bound>>20)
	}
	assertReady(t, env.URL)
}
