package server_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	sidecarpkg "github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

const keyA, keyB = "app-key-alice-61c2", "app-key-bob-0e94"

// identityEnv is a sidecar without a Core key of its own, in front of a
// simulator with one user per key; its logs are kept for a grep.
func identityEnv(t *testing.T, calls *atomic.Int32) (*sidecar, *testenv.LogBuffer) {
	t.Helper()
	logs := &testenv.LogBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	count := func(h tool.Handler) tool.Handler {
		return func(ctx context.Context, c *tool.Call) ([]byte, error) { calls.Add(1); return h(ctx, c) }
	}
	env := testenv.Start(t, threeCalls(), testenv.Options{PerKeyUsers: true, Sidecar: []sidecarpkg.Option{sidecarpkg.WithLogger(log)}},
		testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: count(testenv.Echo)},
		testenv.Tool{Config: config.Tool{Name: "fail"}, Handler: count(standardTools()[1].Handler)},
		testenv.Tool{Config: config.Tool{Name: "idle"}})
	return &sidecar{env: env, url: env.URL}, logs
}

// TestProxyModeCallerIdentity: an unmodified SDK with its own key, and a
// sidecar with none, completes a 2-turn, 3-call run; every Core request of
// the run carries the application's key, and the logs never show it.
func TestProxyModeCallerIdentity(t *testing.T) {
	var calls atomic.Int32
	sc, logs := identityEnv(t, &calls)
	c := sdk{t: t, base: sc.url, key: keyA}
	var asst, th, msg, run struct{ ID string }
	c.call("POST", "/v1/assistants", map[string]any{"name": "a", "model": "vllm/x", "tools": sc.env.Registry.FunctionTools()}, &asst)
	c.call("POST", "/v1/threads", map[string]any{"meta_data": map[string]any{}}, &th)
	c.call("POST", "/v1/messages", map[string]any{"content": "hi", "thread_id": th.ID, "assistant_id": asst.ID, "role": "user"}, &msg)
	c.call("POST", "/v1/runs", map[string]any{"assistant_id": asst.ID, "thread_id": th.ID, "instructions": ""}, &run)
	content, manifests, _ := c.streamEvents(map[string]any{"model": "vllm/x", "api_key": nil, "thread_id": th.ID,
		"message_id": msg.ID, "run_id": run.ID, "assistant_id": asst.ID, "stream": true})
	if len(manifests) != 0 || content != "Checking."+wantAnswer {
		t.Fatalf("content %q, manifests %v", content, manifests)
	}
	if calls.Load() != 3 {
		t.Errorf("%d calls ran, want 3", calls.Load())
	}
	sc.env.AssertWholeBatches(testenv.Run{RunID: run.ID, ThreadID: th.ID}, 3)
	for _, r := range sc.env.Sim.Requests() {
		if r.Path != "/v1/completions" && r.Key != keyA {
			t.Errorf("%s %s carried key %q, want the application's", r.Method, r.Path, r.Key)
		}
	}
	if strings.Contains(logs.String(), keyA) {
		t.Error("the application's key appears in the logs")
	}
}

// TestForeignRunRefused: Bob's key cannot drive Alice's run: the drive is
// refused with Core's answer before anything is dispatched, and Alice's
// run is untouched. Without any key (and no sidecar key), a drive is
// refused as Core refuses it.
func TestForeignRunRefused(t *testing.T) {
	var calls atomic.Int32
	sc, logs := identityEnv(t, &calls)
	alice, err := core.New(core.Config{URL: sc.env.SimURL, APIKey: keyA})
	if err != nil {
		t.Fatal(err)
	}
	r := testenv.SetUpRun(t, alice, sc.env.Registry.FunctionTools())
	for key, want := range map[string]int{keyB: http.StatusNotFound, "": http.StatusUnauthorized} {
		header := map[string]string{}
		if key != "" {
			header["X-API-Key"] = key
		}
		resp, sum := testenv.Drive(t, sc.url, r, header)
		if resp.StatusCode != want || sum.Status != executor.StatusFailed {
			t.Errorf("key %q: %d %+v, want %d", key, resp.StatusCode, sum, want)
		}
	}
	if calls.Load() != 0 {
		t.Errorf("%d calls ran for a caller who does not own the run", calls.Load())
	}
	if n := sc.env.Sim.CountRequests("POST", "/v1/completions"); n != 0 {
		t.Errorf("%d completions requests on Alice's run", n)
	}
	if run, _ := sc.env.Sim.Run(r.RunID); run.Status != core.RunQueued || len(sc.env.Sim.Actions(r.RunID)) != 0 {
		t.Errorf("Alice's run was touched: %+v", run)
	}
	// Alice's own key drives it.
	resp, sum := testenv.Drive(t, sc.url, r, map[string]string{"X-API-Key": keyA})
	if resp.StatusCode != 200 || sum.Status != executor.StatusCompleted {
		t.Fatalf("Alice's drive: %d %+v", resp.StatusCode, sum)
	}
	sc.env.AssertWholeBatches(r, 3)
	for _, k := range []string{keyA, keyB} {
		if strings.Contains(logs.String(), k) {
			t.Errorf("key %s appears in the logs", k)
		}
	}
}
