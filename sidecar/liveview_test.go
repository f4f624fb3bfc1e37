package sidecar_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

func get(t *testing.T, ctx context.Context, url, token string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestLiveViewAuth: with a token, the page (HTML, script, style) is
// served without it, with a policy that forbids framing and other origins,
// but its data is not: /ui/events and /v1/approvals answer 401 without the
// token, and with it the stream opens with a snapshot of the runs. With
// server.ui false there is no page and no stream.
func TestLiveViewAuth(t *testing.T) {
	const token = "view-token-0b7d"
	sc := coresim.Scenario{Turns: []coresim.Turn{{Content: "hello"}}}
	env := testenv.Start(t, sc, testenv.Options{Token: token}, testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	r := env.NewRun()
	testenv.Drive(t, env.URL, r, map[string]string{"Authorization": "Bearer " + token})
	ctx := context.Background()
	for _, p := range []string{"/ui", "/ui/", "/ui/app.js", "/ui/style.css"} {
		resp := get(t, ctx, env.URL+p, "")
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") ||
			resp.Header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s: %d, headers %v", p, resp.StatusCode, resp.Header)
		}
	}
	for _, p := range []string{"/ui/events", "/v1/approvals", "/ui/other.js"} {
		resp := get(t, ctx, env.URL+p, "")
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", p, resp.StatusCode)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp := get(t, sctx, env.URL+"/ui/events", token)
	defer resp.Body.Close()
	sc2 := bufio.NewScanner(resp.Body)
	sc2.Buffer(nil, 1<<20)
	var first []string
	for len(first) < 2 && sc2.Scan() {
		if line := sc2.Text(); line != "" {
			first = append(first, line)
		}
	}
	if len(first) < 2 || first[0] != "event: snapshot" || !strings.Contains(first[1], `"id":"`+r.RunID+`"`) || !strings.Contains(first[1], `"status":"completed"`) {
		t.Errorf("the stream began %q, want a snapshot with the completed run", first)
	}

	off := testenv.Start(t, sc, testenv.Options{Server: func(s *config.Server) { s.UI = false }})
	for _, p := range []string{"/ui", "/ui/events"} {
		resp := get(t, ctx, off.URL+p, "")
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s with server.ui false: %d, want 404", p, resp.StatusCode)
		}
	}
}

// TestLiveViewDoesNotHoldShutdown: a browser left open on the live view
// does not hold a graceful shutdown: its stream ends as the shutdown
// begins, and the shutdown finishes without reaching its deadline.
func TestLiveViewDoesNotHoldShutdown(t *testing.T) {
	logs := &testenv.LogBuffer{}
	env := testenv.Start(t, coresim.Scenario{Turns: []coresim.Turn{{Content: "hello"}}}, testenv.Options{
		Sidecar: []sidecar.Option{sidecar.WithLogger(slog.New(slog.NewJSONHandler(logs, nil)))}})
	resp := get(t, context.Background(), env.URL+"/ui/events", "")
	defer resp.Body.Close()
	first := bufio.NewReader(resp.Body)
	if line, err := first.ReadString('\n'); err != nil || line != "event: snapshot\n" {
		t.Fatalf("the stream began %q %v", line, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- env.Sidecar.Shutdown(ctx) }()
	if _, err := io.Copy(io.Discard, first); err != nil {
		t.Errorf("the stream ended with %v, want its end", err)
	}
	<-shut
	if strings.Contains(logs.String(), "shutdown deadline") {
		t.Errorf("the shutdown reached its deadline:\n%s", logs.String())
	}
}
