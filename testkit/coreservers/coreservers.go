// Package coreservers serves Core on the servers users run it on, each in
// a process of its own, so that a guarantee is tested against the Core
// servers of the field and not only against the Go simulator:
//
//   - [GoSim]: the Go simulator (sim/coresim) in a process of its own;
//   - [Nginx], [NginxLimited]: Debian's nginx with Core's shipped
//     `location /` block (docker/nginx/nginx.conf of Project David Core) in
//     front of the Go simulator, without and with its limit_req lines;
//   - [Python]: a Core stand-in (testdata/corestandin.py) on Python's
//     http.server.ThreadingHTTPServer, whose listen backlog is 5;
//   - [Uvicorn]: the same stand-in on uvicorn, the server Core runs on.
//
// Every run of a server plays one [Batch]: a turn of its calls, then a
// turn that answers. A test binary that uses the Go simulator's kinds
// calls testenv.MaybeServe first in its TestMain. nginx and uvicorn are
// Debian packages (make core-servers installs them): a kind whose server
// is missing is skipped, saying so, unless TSC_TEST_REQUIRE_NGINX is set
// (make test sets it), and then fails.
package coreservers

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// Kind names a Core server of the matrix.
type Kind string

// The kinds of Core server.
const (
	GoSim        Kind = "gosim"
	Nginx        Kind = "nginx"
	NginxLimited Kind = "nginx_limit_req"
	Python       Kind = "python"
	Uvicorn      Kind = "uvicorn"
)

// All are the kinds, the Go simulator first.
var All = []Kind{GoSim, Nginx, NginxLimited, Python, Uvicorn}

// RequireEnv, when set, makes a missing nginx or uvicorn a failure
// instead of a skip.
const RequireEnv = "TSC_TEST_REQUIRE_NGINX"

// Batch is the script of every run of a server: Calls calls of Tool,
// whose arguments are {"i": "<k>"}, then a turn that answers "done".
type Batch struct {
	Tool  string
	Calls int
}

// Scenario is b as the Go simulator plays it.
func (b Batch) Scenario() coresim.Scenario {
	calls := make([]coresim.Call, b.Calls)
	for i := range calls {
		calls[i] = coresim.Call{Tool: b.Tool, ArgsJSON: fmt.Sprintf(`{"i": "%d"}`, i)}
	}
	return coresim.Scenario{Turns: []coresim.Turn{{Calls: calls}, {Content: "done"}}}
}

// Server is a running Core server of one kind.
type Server struct {
	Kind Kind
	// URL is Core's base URL, for the sidecar: the front's, if any.
	URL string
	// Upstream is the server behind the front (URL when there is none):
	// the set-up calls and checks of a test go there, past a rate limit.
	Upstream string
	// App is an application's client of Upstream.
	App *core.Client

	violations func() []coresim.Violation // the Go simulator's contract log
}

// Start serves kind for the test, each run playing b.
func Start(t testing.TB, kind Kind, b Batch) *Server {
	t.Helper()
	s := &Server{Kind: kind}
	switch kind {
	case GoSim, Nginx, NginxLimited:
		serve, violations := testenv.CoreProcess(t, coresim.Config{Scenario: b.Scenario(), SplitWrites: true})
		url, app, stop := serve(nil)
		t.Cleanup(stop)
		s.Upstream, s.App, s.violations = url, app, violations
	case Python, Uvicorn:
		s.Upstream = standIn(t, kind, b)
		app, err := core.New(core.Config{URL: s.Upstream, APIKey: testenv.APIKey, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s.App = app
	default:
		t.Fatalf("coreservers: no kind %q", kind)
	}
	s.URL = s.Upstream
	if kind == Nginx || kind == NginxLimited {
		s.URL = nginx(t, s.Upstream, kind == NginxLimited)
	}
	return s
}

// ServeCore is a testenv.Options.ServeCore that serves s: the sidecar
// meets s.URL, the application's set-up s.Upstream. The simulator it is
// given is not used.
func (s *Server) ServeCore() func(*coresim.Sim) (string, *core.Client, func()) {
	return func(*coresim.Sim) (string, *core.Client, func()) { return s.URL, s.App, func() {} }
}

// missing skips the test for want, or fails it when RequireEnv is set.
func missing(t testing.TB, want string) {
	t.Helper()
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("%s not found, and %s is set (make core-servers installs it)", want, RequireEnv)
	}
	t.Skipf("%s not found: this Core server kind needs it (make core-servers installs Debian's)", want)
}

// standIn starts testdata/corestandin.py on kind's server and returns
// its base URL.
func standIn(t testing.TB, kind Kind, b Batch) string {
	t.Helper()
	server, python := "threading", pythonWith(t, "")
	if kind == Uvicorn {
		server, python = "uvicorn", pythonWith(t, "uvicorn")
	}
	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "testdata", "corestandin.py")
	cmd := exec.Command(python, script, "--server", server, "--calls", fmt.Sprint(b.Calls), "--tool", b.Tool)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the stand-in serves until its stdin closes
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the Core stand-in (%s) did not start: %v", server, err)
	}
	return strings.TrimSpace(line)
}

// pythonWith is a Python 3 that imports module ("": any): the first on
// PATH, else Debian's, where its python3- packages are.
func pythonWith(t testing.TB, module string) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		if module == "" || exec.Command(path, "-c", "import "+module).Run() == nil {
			return path
		}
	}
	if module == "" {
		t.Skip("no python3 found: the Python Core stand-in needs it")
	}
	missing(t, "python3 with "+module)
	return ""
}

// coreLocation is Core's shipped `location /` block (docker/nginx/nginx.conf),
// with its limit_req line when limited.
const coreLocation = `
    location / {
      %s
      proxy_pass http://%s;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_buffering off;
    }`

// nginx starts Debian's nginx in front of upstream with Core's location
// block, as the test's own process (daemon off, everything in a temp
// dir), and returns its base URL.
func nginx(t testing.TB, upstream string, limited bool) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/nginx"); err != nil {
			missing(t, "nginx")
		}
	}
	dir := t.TempDir()
	var zone, limit, user string
	if limited {
		zone = "limit_req_zone $binary_remote_addr zone=api:10m rate=30r/m;"
		limit = "limit_req zone=api burst=20 nodelay;"
	}
	if os.Geteuid() == 0 {
		user = "user root;" // the worker writes the temp dir, which only its owner may
	}
	for range 5 { // the free port picked may be taken before nginx binds it
		addr := freeAddr(t)
		conf := fmt.Sprintf(`%s
daemon off;
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 1024; }
http {
  access_log %[2]s/access.log;
  client_body_temp_path %[2]s/client_body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  gzip on;
  gzip_types application/json;
  gzip_min_length 1000;
  %[3]s
  server {
    listen %[4]s;
    %[5]s
  }
}
`, user, dir, zone, addr, fmt.Sprintf(coreLocation, limit, strings.TrimPrefix(upstream, "http://")))
		path := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		up := func() bool {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err == nil
		}
		ready := false
		for !ready {
			select {
			case <-exited:
			case <-time.After(10 * time.Millisecond):
				ready = up()
				continue
			}
			break
		}
		if !ready {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx exited: %s", log)
			continue
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGQUIT) // graceful: the workers finish what they serve
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
		return "http://" + addr
	}
	t.Fatal("nginx did not start")
	return ""
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// received is a request as the stand-in recorded it.
type received struct {
	Method string         `json:"method"`
	Path   string         `json:"path"`
	Body   map[string]any `json:"body"`
}

// Check asserts Core's side of run r after its drive: wantCalls Actions,
// each final (completed, failed or cancelled); one tool message for each,
// naming it, in the order of its calls; and what the server itself saw:
// the Go simulator's contract log empty, or, on the stand-in, each output
// received once, in call order, and each Action finalised only after its
// output.
func (s *Server) Check(t testing.TB, r testenv.Run, wantCalls int) {
	t.Helper()
	ctx := context.Background()
	var acts []core.Action
	for _, st := range []string{core.ActionPending, core.ActionProcessing, core.ActionCompleted, core.ActionFailed, core.ActionCancelled} {
		as, err := s.App.ActionsByStatus(ctx, r.RunID, st)
		if err != nil {
			t.Fatal(err)
		}
		acts = append(acts, as...)
	}
	slices.SortFunc(acts, func(a, b core.Action) int {
		return strings.Compare(fmt.Sprint(a.TriggeredAt), fmt.Sprint(b.TriggeredAt))
	})
	msgs, err := s.App.ListMessages(ctx, r.ThreadID, 100)
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(msgs) // newest first: in order
	msgs = slices.DeleteFunc(msgs, func(m core.Message) bool { return m.Role != "tool" })
	if len(acts) != wantCalls || len(msgs) != wantCalls {
		t.Fatalf("%s: %d actions and %d tool messages, want %d of each", s.Kind, len(acts), len(msgs), wantCalls)
	}
	for i, a := range acts {
		if msgs[i].ToolCallID != a.ToolCallID || msgs[i].ToolID != a.ID {
			t.Errorf("%s: tool message %d is for (%s, %s), want call %d's (%s, %s)", s.Kind, i, msgs[i].ToolCallID, msgs[i].ToolID, i, a.ToolCallID, a.ID)
		}
		if !slices.Contains([]string{core.ActionCompleted, core.ActionFailed, core.ActionCancelled}, a.Status) {
			t.Errorf("%s: action %s left %s", s.Kind, a.ID, a.Status)
		}
	}
	if s.violations != nil {
		if v := s.violations(); len(v) > 0 {
			t.Errorf("%s: contract violations: %v", s.Kind, v)
		}
		return
	}
	s.checkReceived(t, acts)
}

// checkReceived checks the stand-in's record of what it received for
// the Actions acts, in call order.
func (s *Server) checkReceived(t testing.TB, acts []core.Action) {
	t.Helper()
	resp, err := http.Get(s.Upstream + "/_sim/requests")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var reqs []received
	if err := json.NewDecoder(resp.Body).Decode(&reqs); err != nil {
		t.Fatalf("%s: the stand-in's record: %v", s.Kind, err)
	}
	index := map[string]int{} // action id: call index
	for i, a := range acts {
		index[a.ID] = i
	}
	outputs := map[string]int{}
	next := 0 // the call whose output comes next
	for _, q := range reqs {
		switch {
		case q.Method == http.MethodPost && q.Path == "/v1/messages/tools":
			id, _ := q.Body["tool_id"].(string)
			if outputs[id]++; outputs[id] > 1 {
				t.Errorf("%s: output of action %s received %d times", s.Kind, id, outputs[id])
			} else if i, ok := index[id]; ok {
				if i != next {
					t.Errorf("%s: output of call %d received when call %d's was due", s.Kind, i, next)
				}
				next = i + 1
			}
		case q.Method == http.MethodPut && strings.HasPrefix(q.Path, "/v1/actions/"):
			id := strings.TrimPrefix(q.Path, "/v1/actions/")
			st, _ := q.Body["status"].(string)
			final := st == core.ActionCompleted || st == core.ActionFailed || st == core.ActionCancelled
			if final && outputs[id] == 0 {
				t.Errorf("%s: action %s set %s before its output was received", s.Kind, id, st)
			}
			if !final && outputs[id] > 0 {
				t.Errorf("%s: action %s set %s after its output", s.Kind, id, st)
			}
		}
	}
	if next != len(acts) {
		t.Errorf("%s: outputs received for %d of %d calls", s.Kind, next, len(acts))
	}
}
