package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/tool"
)

func TestMain(m *testing.M) {
	serveMCPIfAsked() // a test's MCP server, started as this binary again
	goleak.VerifyTestMain(m)
}

const manifest = `{"type": "tool_call_manifest", "run_id": "run_1", "action_id": "act_1", "tool_call_id": "call_1", "tool": "t", "args": {"departure": "LAX", "arrival": "JFK"}}`

// local compiles one tool and returns an in-process dispatcher for it.
func local(t *testing.T, tc config.Tool) *Local {
	t.Helper()
	tc.Name = "t"
	if tc.Timeout == 0 {
		tc.Timeout = 5 * time.Second
	}
	reg, err := compileTools([]config.Tool{tc}, "p")
	if err != nil {
		t.Fatal(err)
	}
	return NewLocal(registry.NewLive(reg), nil)
}

func dispatch(l *Local, timeout time.Duration) tool.Outcome {
	return l.Dispatch(context.Background(), tool.Request{Tool: "t", Body: []byte(manifest), ActionID: "act_1", Attempt: 1, Timeout: timeout})
}

func sh(script string, env map[string]string) config.Tool {
	e := map[string]any{}
	for k, v := range env {
		e[k] = v
	}
	return config.Tool{Route: "exec", Settings: map[string]any{"exec": map[string]any{"command": []any{"/bin/sh", "-c", script}, "env": e}}}
}

func TestExec(t *testing.T) {
	t.Setenv("SIDECAR_SECRET", "hunter2")
	cases := []struct {
		name     string
		def      config.Tool
		wantData string
		wantErr  tool.ErrorType
		wantMsg  string
	}{
		{"stdin to stdout", sh(`cat`, nil), manifest, "", ""},
		{"env is configured, not inherited", sh(`printf '%s|%s' "$GREETING" "$SIDECAR_SECRET"`, map[string]string{"GREETING": "hi"}), "hi|", "", ""},
		{"non-zero exit", sh(`echo "quota exceeded" >&2; exit 4`, nil), "", tool.ToolFailed, `exited with status 4: quota exceeded`},
		{"output bound", config.Tool{Route: "exec", Settings: map[string]any{"exec": map[string]any{"command": []any{"/bin/sh", "-c", "head -c 5000 /dev/zero"}, "max_output_bytes": 1000}}}, "", tool.ToolFailed, "exceeds 1000 bytes"},
		{"missing binary", config.Tool{Route: "exec", Settings: map[string]any{"exec": map[string]any{"command": []any{"/no/such/binary"}}}}, "", tool.ToolFailed, "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := dispatch(local(t, tc.def), 5*time.Second)
			if tc.wantErr == "" {
				if r.Err != nil || string(r.Data) != tc.wantData {
					t.Fatalf("reply %q %v, want %q", r.Data, r.Err, tc.wantData)
				}
				return
			}
			if r.Err == nil || r.Err.Type != tc.wantErr || !strings.Contains(r.Err.Message, tc.wantMsg) {
				t.Fatalf("reply err %+v, want %s containing %q", r.Err, tc.wantErr, tc.wantMsg)
			}
		})
	}
}

// TestExecTimeoutKillsGroup: a timeout kills the command and the children
// it started.
func TestExecTimeoutKillsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	def := sh(`sleep 30 & echo $! > `+pidFile+`; wait`, nil)
	start := time.Now()
	r := dispatch(local(t, def), time.Second)
	if r.Err == nil || r.Err.Type != tool.Timeout {
		t.Fatalf("reply %+v, want timeout", r.Err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("kill took %s", time.Since(start))
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	poll.Until(t, fmt.Sprintf("child %d, which survived the timeout, to die", pid), func() bool { return syscall.Kill(pid, 0) != nil })
}

// TestPythonStdlibExample runs the shipped Python example through route
// exec: no NATS client needed on the Python side.
func TestPythonStdlibExample(t *testing.T) {
	script, _ := filepath.Abs("python/examples/exec_tool.py")
	def := config.Tool{Route: "exec", Settings: map[string]any{"exec": map[string]any{"command": []any{"python3", script}}}}
	r := dispatch(local(t, def), 10*time.Second)
	var out map[string]string
	if r.Err != nil || json.Unmarshal(r.Data, &out) != nil || out["route"] != "LAX-JFK" || out["tool_call_id"] != "call_1" {
		t.Fatalf("reply %s %+v", r.Data, r.Err)
	}
	l := local(t, def)
	bad := strings.Replace(manifest, `"JFK"`, `"XXX"`, 1)
	r = l.Dispatch(context.Background(), tool.Request{Tool: "t", Body: []byte(bad), Timeout: 10 * time.Second})
	if r.Err == nil || r.Err.Type != tool.ToolFailed || !strings.Contains(r.Err.Message, "exited with status 3: no flights from LAX to XXX") {
		t.Fatalf("error path %+v", r.Err)
	}
}

func TestHTTP(t *testing.T) {
	var gotHeaders http.Header
	var gotBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHeaders = r.Header.Clone()
		gotBody, _ = io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/ok":
			io.WriteString(w, `{"ok": true}`)
		case "/bad":
			http.Error(w, "missing field city", http.StatusBadRequest)
		case "/busy":
			http.Error(w, "slow down", http.StatusTooManyRequests)
		case "/down":
			http.Error(w, "maintenance", http.StatusServiceUnavailable)
		case "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}
	}))
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("tok\n"), 0o600)
	httpTool := func(path string) config.Tool {
		return config.Tool{Route: "http", Settings: map[string]any{"http": map[string]any{"url": srv.URL + path, "headers": map[string]any{"X-Team": "travel"}, "bearer_token_file": tokenFile}}}
	}
	r := dispatch(local(t, httpTool("/ok")), 5*time.Second)
	if r.Err != nil || string(r.Data) != `{"ok": true}` || string(gotBody) != manifest {
		t.Fatalf("ok: %s %+v body %s", r.Data, r.Err, gotBody)
	}
	if gotHeaders.Get("Authorization") != "Bearer tok" || gotHeaders.Get("X-Team") != "travel" || gotHeaders.Get(tool.HeaderIdempotencyKey) != "act_1" || gotHeaders.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", gotHeaders)
	}
	for path, want := range map[string]tool.ErrorType{"/bad": tool.ToolFailed, "/busy": tool.RateLimited, "/down": tool.WorkerCrash} {
		r := dispatch(local(t, httpTool(path)), 5*time.Second)
		if r.Err == nil || r.Err.Type != want {
			t.Errorf("%s: %+v, want %s", path, r.Err, want)
		}
		retryable := want != tool.ToolFailed
		if r.Err != nil && r.Err.Retryable() != retryable {
			t.Errorf("%s: retryable %v, want %v (4xx final; 429, 5xx retryable)", path, r.Err.Retryable(), retryable)
		}
	}
	if r := dispatch(local(t, httpTool("/slow")), 200*time.Millisecond); r.Err == nil || r.Err.Type != tool.Timeout || !r.Err.Retryable() {
		t.Errorf("slow: %+v, want a retryable timeout", r.Err)
	}
}

// TestHTTPKeepsConnections: two rounds of 32 calls at once to an http
// tool; the second reuses the connections of the first, none is opened.
func TestHTTPKeepsConnections(t *testing.T) {
	const calls = 32
	var arrived, conns atomic.Int32
	var release atomic.Pointer[chan struct{}]
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ch := *release.Load()
		arrived.Add(1)
		<-ch
		io.WriteString(w, `{"ok": true}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	l := local(t, config.Tool{Route: "http", Settings: map[string]any{"http": map[string]any{"url": srv.URL}}})
	for round := 1; round <= 2; round++ {
		ch := make(chan struct{})
		release.Store(&ch)
		var wg sync.WaitGroup
		var failed atomic.Int32
		for range calls {
			wg.Go(func() {
				if r := dispatch(l, 5*time.Second); r.Err != nil {
					failed.Add(1)
				}
			})
		}
		poll.Until(t, "every call to reach the tool", func() bool { return arrived.Load() == int32(round*calls) })
		close(ch)
		wg.Wait()
		if failed.Load() != 0 {
			t.Fatalf("round %d: %d calls failed", round, failed.Load())
		}
		if n := conns.Load(); n != calls {
			t.Fatalf("after round %d of %d calls at once: %d connections, want %d", round, calls, n, calls)
		}
	}
}

func TestSettingsChecks(t *testing.T) {
	cases := []struct {
		tool config.Tool
		want string
	}{
		{config.Tool{Name: "a", Route: "exec"}, "tools[0].exec.command: must be a non-empty list"},
		{config.Tool{Name: "a", Route: "exec", Settings: map[string]any{"exec": map[string]any{"command": []any{"x"}, "cwd": "/"}}}, `tools[0].exec: json: unknown field "cwd"`},
		{config.Tool{Name: "a", Route: "http", Settings: map[string]any{"http": map[string]any{"url": "ftp://x"}}}, `tools[0].http.url: "ftp://x" is not an http(s) URL`},
		{config.Tool{Name: "a", Route: "http", Settings: map[string]any{"http": map[string]any{"url": "http://x", "header": map[string]any{}}}}, `unknown field "header"`},
		{config.Tool{Name: "a", Route: "mcp"}, "set command (a stdio server) or url"},
		{config.Tool{Name: "a", Route: "mcp", Settings: map[string]any{"mcp": map[string]any{"command": []any{"x"}, "url": "http://x"}}}, "not both"},
		{config.Tool{Name: "a", Route: "mcp", Settings: map[string]any{"mcp": map[string]any{"url": "unix:///x"}}}, `mcp.url: "unix:///x" is not an http(s) URL`},
	}
	for _, tc := range cases {
		if _, err := compileTools([]config.Tool{tc.tool}, "p"); !errors.Is(err, registry.ErrInvalidTool) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err %v, want %q", err, tc.want)
		}
	}
	if got := testKinds.Names(); !slices.Contains(got, "exec") || !slices.Contains(got, "http") || !slices.Contains(got, "nats") {
		t.Errorf("kinds %v", got)
	}
	l := NewLocal(registry.NewLive(mustRegistry(t)), nil)
	if r := l.Dispatch(context.Background(), tool.Request{Tool: "ghost"}); r.Err == nil || r.Err.Type != tool.NotFound {
		t.Errorf("unknown tool: %+v", r.Err)
	}
	if r := l.Dispatch(context.Background(), tool.Request{Tool: "n"}); r.Err == nil || !strings.Contains(r.Err.Message, "sends no call to NATS") {
		t.Errorf("a nats tool where no NATS client is: %+v", r.Err)
	}
}

func mustRegistry(t *testing.T) *registry.Registry {
	reg, err := compileTools([]config.Tool{{Name: "n", Route: "nats"}}, "p")
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestHTTPRedirectsAndLinkLocal: a redirect is not followed unless the
// tool allows same-origin ones, and never to another origin, so neither
// the manifest nor the bearer token reaches the redirect target; a
// link-local destination (cloud metadata) is refused before any packet.
func TestHTTPRedirectsAndLinkLocal(t *testing.T) {
	var leaked atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Add(1)
		io.WriteString(w, `"forged"`)
	}))
	defer other.Close()
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/x", http.StatusTemporaryRedirect)
		case "/here":
			http.Redirect(w, r, srv.URL+"/ok", http.StatusTemporaryRedirect)
		case "/ok":
			io.WriteString(w, `"fine"`)
		}
	}))
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("tok\n"), 0o600)
	def := func(url, follow string) config.Tool {
		return config.Tool{Route: "http", Settings: map[string]any{"http": map[string]any{"url": url, "bearer_token_file": tokenFile, "follow_redirects": follow}}}
	}
	for _, tc := range []struct {
		url, follow, want string
	}{
		{srv.URL + "/away", "", "redirect not followed"},
		{srv.URL + "/here", "", "redirect not followed"},
		{srv.URL + "/away", "same_origin", "another origin"},
		{"http://169.254.169.254/latest/meta-data", "", "link-local address refused"},
	} {
		r := dispatch(local(t, def(tc.url, tc.follow)), 5*time.Second)
		if r.Err == nil || r.Err.Type != tool.ToolFailed || r.Err.Retryable() || !strings.Contains(r.Err.Message, tc.want) {
			t.Errorf("%s (%s): %+v, want a tool_error saying %q", tc.url, tc.follow, r.Err, tc.want)
		}
	}
	if r := dispatch(local(t, def(srv.URL+"/here", "same_origin")), 5*time.Second); r.Err != nil || string(r.Data) != `"fine"` {
		t.Errorf("same-origin redirect: %q %+v", r.Data, r.Err)
	}
	if leaked.Load() != 0 {
		t.Errorf("the redirect target was reached %d times", leaked.Load())
	}
	if _, err := compileTools([]config.Tool{{Name: "t", Route: "http", Settings: map[string]any{"http": map[string]any{"url": srv.URL, "follow_redirects": "always"}}}}, "p"); err == nil {
		t.Error("follow_redirects: always was accepted")
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, []byte(" \n"), 0o600)
	if _, err := compileTools([]config.Tool{{Name: "t", Route: "http", Settings: map[string]any{"http": map[string]any{"url": srv.URL, "bearer_token_file": empty}}}}, "p"); err == nil || !strings.Contains(err.Error(), "http.bearer_token_file") {
		t.Errorf("an empty token file: %v, want an error naming http.bearer_token_file", err)
	}
}

// TestExecTimeoutKillsSetsidChild: a child that leaves the process group
// with setsid is killed at the deadline all the same.
func TestExecTimeoutKillsSetsidChild(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	def := sh(`setsid sh -c 'echo $$ > `+pidFile+`; exec sleep 30' & wait`, nil)
	r := dispatch(local(t, def), time.Second)
	if r.Err == nil || r.Err.Type != tool.Timeout {
		t.Fatalf("reply %+v, want timeout", r.Err)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	poll.Until(t, fmt.Sprintf("setsid child %d to die", pid), func() bool {
		// A zombie awaiting its reaper counts as gone.
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(stat), ") Z ")
	})
}

// TestOnSentBeforeTheToolsTime: in process the OnSent hook (the sidecar
// telling Core the call started) runs before the tool, and its time is not
// taken from the tool's timeout.
func TestOnSentBeforeTheToolsTime(t *testing.T) {
	l := local(t, sh(`printf '"ran"'`, nil))
	hooked := false
	out := l.Dispatch(context.Background(), tool.Request{Tool: "t", Body: []byte(manifest), ActionID: "act_1", Attempt: 1, Timeout: 2 * time.Second,
		OnSent: func() { hooked = true; time.Sleep(2500 * time.Millisecond) }})
	if !hooked || out.Err != nil || string(out.Data) != `"ran"` {
		t.Fatalf("hooked %v, outcome %+v: want the tool to run with its whole timeout after the hook", hooked, out)
	}
}
