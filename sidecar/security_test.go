package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

func secretFile(t *testing.T, name, value string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAnonymousRefused: a client without credentials cannot connect to the
// embedded server, so it cannot read manifests and results.
func TestAnonymousRefused(t *testing.T) {
	env := testenv.New(t, oneCall("echo"))
	nc, err := nats.Connect(env.NATSURL, nats.NoReconnect())
	if err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	}
	if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("err %v, want an authorization violation", err)
	}
}

// TestWorkerCannotForge: a worker user that serves tool "a" tries to read
// everything and to serve another tool, which the server denies, and to
// publish forged outcomes to reply subjects near its own, which either the
// server denies or nobody accepts; the batch's outcomes are the honest ones.
func TestWorkerCannotForge(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "a", ArgsJSON: `{}`}, {Tool: "b", ArgsJSON: `{}`}, {Tool: "b", ArgsJSON: `{}`}}},
		{Content: "{{results}}"}}}
	release := make(chan struct{})
	var bCalls atomic.Int32
	env := testenv.Start(t, sc, testenv.Options{Workers: []config.Worker{{Name: "mallory", PasswordFile: secretFile(t, "mallory", "mallory-pw"), Tools: []string{"a"}}}},
		testenv.Tool{Config: config.Tool{Name: "a"}},
		testenv.Tool{Config: config.Tool{Name: "b"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
			bCalls.Add(1)
			select { // stay in flight while mallory forges
			case <-release:
				return []byte(`"honest b"`), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}})
	var denied atomic.Int32
	nc, err := nats.Connect(env.NATSURL, nats.UserInfo("mallory", "mallory-pw"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
				denied.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe(">", func(*nats.Msg) { t.Error("mallory read a message on >") }); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe(testenv.Prefix+".b", func(*nats.Msg) { t.Error("mallory received a call of b") }); err != nil {
		t.Fatal(err)
	}
	var forged sync.WaitGroup
	forged.Add(1)
	var once sync.Once
	_, err = nc.QueueSubscribe(testenv.Prefix+".a", "toolsidecar", func(m *nats.Msg) {
		// Forge: every token shape near its own reply subject.
		inbox := m.Reply[:strings.LastIndexByte(m.Reply, '.')]
		for i := range 64 {
			nc.Publish(fmt.Sprintf("%s.%d", inbox, i), []byte(`"forged"`))
			nc.Publish(fmt.Sprintf("%s.%x", inbox, i), []byte(`"forged"`))
		}
		nc.Publish(inbox+".*", []byte(`"forged"`))
		m.Respond([]byte(`"honest a"`))
		nc.Flush()
		once.Do(forged.Done)
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	poll.Until(t, "the server to deny mallory's subscriptions", func() bool { return denied.Load() >= 2 })
	r := env.NewRun()
	done := make(chan executor.Summary, 1)
	go func() { sum, _ := env.Sidecar.Drive(context.Background(), testenv.Request(r), nil); done <- sum }()
	forged.Wait()
	// The forgeries are flushed. In durable mode a worker may publish into
	// the sidecar's reply namespace (a reply buffered through a NATS
	// restart needs it), so the unguessable tokens are what stop them.
	close(release)
	sum := <-done
	if sum.Status != executor.StatusCompleted {
		t.Fatalf("summary %+v", sum)
	}
	env.AssertWholeBatches(r, 3)
	for i, m := range env.Sim.ToolMessages(r.ThreadID) {
		if strings.Contains(m.Content, "forged") {
			t.Errorf("output %d is forged: %s", i, m.Content)
		}
	}
}

// TestSecretsNeverLogged: with every secret set (Core API key and a Core
// URL with userinfo, the API token, a worker's password, NATS userinfo),
// a drive and a failed start log none of them.
func TestSecretsNeverLogged(t *testing.T) {
	secrets := map[string]string{"api key": "apikey-5d0c9e", "api token": "token-77aa1b", "worker password": "workerpw-3c9f",
		"core password": "corepass-4b2e", "nats password": "natspass-9e61"}
	sim, srv := coresim.NewServer(coresim.Config{APIKey: secrets["api key"], Scenario: oneCall("echo")})
	defer srv.Close()
	var logs testenv.LogBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg, _ := testenv.Config(t, strings.Replace(srv.URL, "http://", "http://coreuser:"+secrets["core password"]+"@", 1), testenv.Options{Token: secrets["api token"]},
		[]testenv.Tool{{Config: config.Tool{Name: "echo"}}})
	cfg.Core.APIKeyFile = secretFile(t, "api-key", secrets["api key"])
	cfg.NATS.Embedded.Workers = append(cfg.NATS.Embedded.Workers, config.Worker{Name: "w2", PasswordFile: secretFile(t, "w2", secrets["worker password"]), Tools: []string{"echo"}})
	s, err := sidecar.Start(context.Background(), cfg, sidecar.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	wnc, err := nats.Connect(s.NATSURL(), nats.UserInfo("w2", secrets["worker password"]))
	if err != nil {
		t.Fatal(err)
	}
	natstest.WorkerOn(t, wnc, testenv.Prefix, map[string]tool.Handler{"echo": testenv.Echo})
	cc, err := core.New(core.Config{URL: srv.URL, APIKey: secrets["api key"]})
	if err != nil {
		t.Fatal(err)
	}
	run := testenv.SetUpRun(t, cc, nil)
	_, sum := testenv.Drive(t, "http://"+s.Addr(), run, map[string]string{"Authorization": "Bearer " + secrets["api token"]})
	if sum.Status != executor.StatusCompleted {
		t.Fatalf("summary %+v", sum)
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	wnc.Close()
	if v := sim.Violations(); len(v) != 0 {
		t.Errorf("violations %v", v)
	}
	// A start that fails on an external NATS with userinfo in its URL.
	bad := config.Default()
	bad.NATS.URL = "nats://alice:" + secrets["nats password"] + "@127.0.0.1:1"
	bad.Core.URL = srv.URL
	_, err = sidecar.Start(context.Background(), bad, sidecar.WithLogger(log), sidecar.WithAPIKey("k"))
	if err == nil {
		t.Fatal("a sidecar started against an unreachable NATS")
	}
	log.Error("toolsidecar stopped", "err", err) // what cmd does with it
	out := logs.String()
	if !strings.Contains(out, "toolsidecar ready") || !strings.Contains(out, "alice") {
		t.Fatalf("the logs miss what they should show:\n%s", out)
	}
	for what, secret := range secrets {
		if strings.Contains(out, secret) {
			t.Errorf("the %s appears in the logs", what)
		}
	}
}

// TestEmptySecretFiles: an empty or blank token or password file stops
// the start, naming the key, instead of turning a protection off.
func TestEmptySecretFiles(t *testing.T) {
	for key, set := range map[string]func(*config.Config, string){
		"server.auth_token_file": func(c *config.Config, f string) { c.Server.AuthTokenFile = f },
		"core.api_key_file":      func(c *config.Config, f string) { c.Core.APIKeyFile = f },
		"nats.embedded.workers[0].password_file": func(c *config.Config, f string) {
			c.NATS.Embedded.Workers[0].PasswordFile = f
		},
	} {
		cfg, _ := testenv.Config(t, "http://127.0.0.1:1", testenv.Options{}, nil)
		set(&cfg, secretFile(t, "blank", "  "))
		if _, err := sidecar.Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s blank: %v, want a start-up error naming it", key, err)
		}
	}
}

// TestStalledConnectionsClosed: connections that send half a request, and
// idle ones, are closed by the server after its timeouts.
func TestStalledConnectionsClosed(t *testing.T) {
	env := testenv.Start(t, oneCall("echo"), testenv.Options{Server: func(s *config.Server) {
		s.ReadHeaderTimeout, s.IdleTimeout = 200*time.Millisecond, 200*time.Millisecond
	}})
	var conns []net.Conn
	for i := range 40 {
		c, err := net.Dial("tcp", env.Sidecar.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if i%2 == 0 {
			io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n") // never finished
		} else {
			io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") // then idle
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(poll.Timeout))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("connection %d: %v, want the server to close it", i, err)
		}
	}
}

// TestDriveCapAndOpsListener: past server.max_drives a drive is answered
// 429 with Retry-After; the ops listener serves probes and metrics without
// the API token, and nothing else.
func TestDriveCapAndOpsListener(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	env := testenv.Start(t, oneCall("slow"), testenv.Options{Token: "tok", Server: func(s *config.Server) {
		s.MaxDrives, s.OpsListen = 1, "127.0.0.1:0"
	}}, testenv.Tool{Config: config.Tool{Name: "slow"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
		close(started)
		<-release
		return []byte(`"ok"`), nil
	}})
	drive := func(r testenv.Run) *http.Response {
		resp, _ := testenv.Drive(t, env.URL, r, map[string]string{"Authorization": "Bearer tok"})
		return resp
	}
	first := make(chan int, 1)
	go func() { first <- drive(env.NewRun()).StatusCode }()
	<-started
	if r := drive(env.NewRun()); r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
		t.Errorf("second drive: %d, Retry-After %q; want 429 with Retry-After", r.StatusCode, r.Header.Get("Retry-After"))
	}
	close(release)
	if code := <-first; code != 200 {
		t.Errorf("first drive: %d", code)
	}
	ops := "http://" + env.Sidecar.OpsAddr()
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/v1/tools": 404} {
		resp, err := http.Get(ops + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("ops %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	resp, err := http.Get(env.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("API /metrics without token: %d, want 401", resp.StatusCode)
	}
}
