package core

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "ftp://x", "http://", "::"} {
		if _, err := New(Config{URL: u}); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	if _, err := New(Config{URL: "http://x"}, WithHTTPClient(nil)); err == nil {
		t.Error("nil http client accepted")
	}
}

// flaky answers status fail for the first n requests, then 200 with body.
func flaky(t *testing.T, n int32, fail int, body string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var count atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if count.Add(1) <= n {
			http.Error(w, "busy", fail)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &count
}

func TestRetriesIdempotentCalls(t *testing.T) {
	srv, count := flaky(t, 2, http.StatusServiceUnavailable, `{"id": "run_1", "status": "queued"}`)
	var seen []int
	c, _ := New(Config{URL: srv.URL}, WithObserver(func(ep string, status int, _ time.Duration) {
		if ep != "runs_get" {
			t.Errorf("endpoint label %q", ep)
		}
		seen = append(seen, status)
	}))
	r, err := c.GetRun(context.Background(), "run_1")
	if err != nil || r.Status != "queued" {
		t.Fatalf("GetRun = %+v, %v", r, err)
	}
	if count.Load() != 3 || len(seen) != 3 || seen[2] != 200 {
		t.Errorf("requests %d, observed %v; want 3 with a final 200", count.Load(), seen)
	}
}

func TestNoRetryOfPostAfterDelivery(t *testing.T) {
	srv, count := flaky(t, 5, http.StatusInternalServerError, `{}`)
	c, _ := New(Config{URL: srv.URL})
	_, err := c.SubmitToolOutput(context.Background(), ToolOutput{ThreadID: "t", ToolID: "a", ToolCallID: "c"})
	if StatusCode(err) != 500 || count.Load() != 1 {
		t.Fatalf("err %v after %d requests; want one 500", err, count.Load())
	}
}

func TestRetryGivesUp(t *testing.T) {
	srv, count := flaky(t, 100, http.StatusBadGateway, `{}`)
	c, _ := New(Config{URL: srv.URL, Retries: 2})
	_, err := c.PendingActions(context.Background(), "run_1")
	if StatusCode(err) != 502 || count.Load() != 3 {
		t.Fatalf("err %v after %d requests; want 502 after 3", err, count.Load())
	}
	srv2, count2 := flaky(t, 100, http.StatusNotFound, `{}`)
	c2, _ := New(Config{URL: srv2.URL})
	if _, err := c2.GetAction(context.Background(), "act_x"); StatusCode(err) != 404 || count2.Load() != 1 {
		t.Fatalf("404 must not be retried: %v after %d", err, count2.Load())
	}
}

// TestIDsThatAreNotIDsAreNotSent: an id that is not an id (100,000
// characters, a '/' or '.', a byte that needs escaping) never becomes a
// path: each request is refused before it is sent, with ErrInvalidID, not
// retried, and its error quotes no more than an excerpt of the id.
func TestIDsThatAreNotIDsAreNotSent(t *testing.T) {
	var count atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count.Add(1)
		io.WriteString(w, `{"id": "run_ok-1"}`)
	}))
	defer srv.Close()
	c, _ := New(Config{URL: srv.URL, Retries: 3})
	ctx := context.Background()
	for _, id := range []string{strings.Repeat("a", 100_000), "act/../runs", "act.x", "act%2F", "act x", ""} {
		errs := []error{
			c.WriteAction(ctx, id, ActionUpdate{Status: ActionCompleted}),
			func() error { _, err := c.GetAction(ctx, id); return err }(),
			func() error { _, err := c.GetRun(ctx, id); return err }(),
			func() error { _, err := c.CancelRun(ctx, id); return err }(),
			func() error { _, err := c.ListMessages(ctx, id, 10); return err }(),
		}
		for i, err := range errs {
			if !errors.Is(err, ErrInvalidID) || len(err.Error()) > 512 {
				t.Errorf("request %d with id %.40q: %.600v, want ErrInvalidID with a short message", i, id, err)
			}
		}
	}
	if n := count.Load(); n != 0 {
		t.Errorf("Core received %d requests", n)
	}
	if _, err := c.GetRun(ctx, "run_ok-1"); err != nil && errors.Is(err, ErrInvalidID) || count.Load() != 1 {
		t.Errorf("a sound id: %v, %d requests", err, count.Load())
	}
}

func TestPostRetriedWhenNeverDelivered(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	var attempts int
	c, _ := New(Config{URL: url, Retries: 2}, WithObserver(func(string, int, time.Duration) { attempts++ }))
	if _, err := c.CreateThread(context.Background()); err == nil {
		t.Fatal("expected an error")
	}
	if attempts != 3 {
		t.Errorf("attempts %d, want 3 (refused connections are retried)", attempts)
	}
}

// TestUnreachableWithinConnectTimeout: a Core that refuses connections
// fails a call once ConnectTimeout has passed, saying it cannot be
// reached, however many retries and however long a Timeout are left.
func TestUnreachableWithinConnectTimeout(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c, _ := New(Config{URL: url, Retries: 1 << 20, Timeout: time.Hour, ConnectTimeout: 100 * time.Millisecond})
	// Only the connect timeout can end the call before this guard.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.CreateThread(ctx)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "Core cannot be reached: tried for core.connect_timeout, 100ms") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("a call to a closed port: %v (ctx %v)", err, ctx.Err())
	}
}

// TestWireBodies checks what goes on the wire for the calls the loop makes.
func TestWireBodies(t *testing.T) {
	type seen struct {
		method, path, key   string
		contentType, accept []string
		body                map[string]any
	}
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		got = append(got, seen{r.Method, r.URL.RequestURI(), r.Header.Get("X-API-Key"), r.Header.Values("Content-Type"), r.Header.Values("Accept"), body})
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.Contains(r.URL.Path, "pending"), strings.Contains(r.URL.Path, "status"):
			io.WriteString(w, `[]`)
		default:
			io.WriteString(w, `{"id": "x"}`)
		}
	}))
	defer srv.Close()
	c, _ := New(Config{URL: srv.URL + "/", APIKey: "sekret"})
	ctx := context.Background()
	c.SubmitToolOutput(ctx, ToolOutput{Content: "r", ThreadID: "t", AssistantID: "a", ToolID: "act_1", ToolCallID: "call_1"})
	c.UpdateAction(ctx, "act_1", ActionUpdate{Status: ActionCompleted, Result: map[string]any{"ok": true}})
	c.ActionsByStatus(ctx, "run_1", "pending")
	c.CancelRun(ctx, "run_1")
	c.CreateRun(ctx, RunCreate{AssistantID: "a", ThreadID: "t"})
	c.CreateAssistant(ctx, AssistantCreate{Name: "n", Model: "vllm/m"})
	c.GetAssistant(ctx, "a")
	c.CreateMessage(ctx, "t", "a", "hi")
	if len(got) != 8 {
		t.Fatalf("got %d requests", len(got))
	}
	for _, s := range got {
		if s.key != "sekret" {
			t.Errorf("%s %s without X-API-Key", s.method, s.path)
		}
		if wantType := s.body != nil; wantType != slices.Equal(s.contentType, []string{"application/json"}) {
			t.Errorf("%s %s has Content-Type %q", s.method, s.path, s.contentType)
		}
		if !slices.Equal(s.accept, []string{"application/json"}) {
			t.Errorf("%s %s has Accept %q", s.method, s.path, s.accept)
		}
	}
	out := got[0].body
	if got[0].path != "/v1/messages/tools" || out["role"] != "tool" || out["tool_id"] != "act_1" || out["tool_call_id"] != "call_1" {
		t.Errorf("tool output body %v", out)
	}
	if _, ok := out["attachments"].([]any); !ok {
		t.Errorf("attachments must be [] as the SDK sends: %v", out)
	}
	if got[1].method != "PUT" || got[1].path != "/v1/actions/act_1" || got[1].body["status"] != "completed" {
		t.Errorf("update %v", got[1])
	}
	if got[2].path != "/v1/runs/run_1/actions/status?status=pending" {
		t.Errorf("by status path %s", got[2].path)
	}
	if got[3].path != "/v1/runs/run_1/cancel" || got[3].method != "POST" {
		t.Errorf("cancel %v", got[3])
	}
	if got[7].body["role"] != "user" || got[7].body["content"] != "hi" {
		t.Errorf("message %v", got[7].body)
	}
}

func TestResponseBodyBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"id": "`+strings.Repeat("a", 4096)+`"}`)
	}))
	defer srv.Close()
	c, _ := New(Config{URL: srv.URL, MaxBodyBytes: 1024})
	if _, err := c.GetRun(context.Background(), "r"); err == nil || !strings.Contains(err.Error(), "over 1024 bytes") {
		t.Fatalf("err = %v, want a size error", err)
	}
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `not json`) }))
	defer srv2.Close()
	c2, _ := New(Config{URL: srv2.URL})
	if _, err := c2.GetRun(context.Background(), "r"); err == nil || !strings.Contains(err.Error(), "decoding") {
		t.Fatalf("err = %v, want a decode error", err)
	}
}

// TestResponseBodyLength: a body whose length is announced is read to
// that length, whether it is decoded (a run read) or dropped (an Action
// written without waiting for it): within the bound the exchange
// succeeds; over it, it is refused; shorter than announced, it fails
// instead of decoding a part.
func TestResponseBodyLength(t *testing.T) {
	run := `{"id": "run_1", "status": "queued"}`
	for name, tc := range map[string]struct {
		announced int
		body      string
		wantErr   string
	}{
		"exact":     {len(run), run, ""},
		"over max":  {2048, run + strings.Repeat(" ", 2048-len(run)), "over 1024 bytes"},
		"too short": {len(run) + 10, run, "reading body"},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(tc.announced))
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			c, _ := New(Config{URL: srv.URL, MaxBodyBytes: 1024, Retries: -1})
			r, err := c.GetRun(context.Background(), "run_1")
			switch {
			case tc.wantErr == "" && (err != nil || r.ID != "run_1" || r.Status != "queued"):
				t.Errorf("run %+v err %v, want run_1 queued", r, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("reading: err = %v, want %q", err, tc.wantErr)
			}
			// A write's answer too long to read (an Action with huge
			// arguments) or cut is taken by its 2xx: the write took effect,
			// and it is not sent again. One read whole must be the Action
			// written, which a run is not.
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err = c.WriteAction(ctx, "act_1", ActionUpdate{Status: ActionCompleted})
			if outOfStep := tc.wantErr == ""; outOfStep != errors.Is(err, ErrOutOfStep) || (!outOfStep && err != nil) {
				t.Errorf("writing: %v, want out of step %v", err, outOfStep)
			}
		})
	}
}

func TestCallRespectsContext(t *testing.T) {
	srv, _ := flaky(t, 100, http.StatusServiceUnavailable, `{}`)
	c, _ := New(Config{URL: srv.URL, Retries: 50})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err := c.GetRun(ctx, "r")
	if err == nil {
		t.Fatal("expected an error once the context ends")
	}
	if errors.Is(err, context.DeadlineExceeded) == false && StatusCode(err) != 503 {
		t.Fatalf("err = %v", err)
	}
}

func TestRunTerminal(t *testing.T) {
	for status, want := range map[string]bool{RunCompleted: true, RunCancelled: true, RunFailed: true, RunExpired: true, RunActionRequired: false, RunQueued: false} {
		if RunTerminal(status) != want {
			t.Errorf("RunTerminal(%q) != %v", status, want)
		}
	}
}

// TestRedirectNotFollowed: a Core that answers a redirect to another host
// gets neither a second request nor the API key there; the call fails with
// the redirect's status, for a short call and for a stream alike.
func TestRedirectNotFollowed(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		io.WriteString(w, `{"id": "run_1", "status": "queued"}`)
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	c, err := New(Config{URL: srv.URL, APIKey: "secret", Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetRun(context.Background(), "run_1"); StatusCode(err) != http.StatusTemporaryRedirect {
		t.Errorf("GetRun: %v, want the 307 as an error", err)
	}
	if _, err := c.Stream(context.Background(), CompletionRequest{RunID: "run_1"}); StatusCode(err) != http.StatusTemporaryRedirect {
		t.Errorf("Stream: %v, want the 307 as an error", err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect target got %d requests", n)
	}
}

// TestURLUserinfo: a Core URL with userinfo authenticates every request,
// short calls and streams, with HTTP basic authentication.
func TestURLUserinfo(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, password, _ := r.BasicAuth()
		seen = append(seen, user+":"+password)
		io.WriteString(w, `{"id": "run_1", "status": "queued"}`)
	}))
	defer srv.Close()
	c, err := New(Config{URL: strings.Replace(srv.URL, "http://", "http://ops:p%40ss@", 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
		t.Fatal(err)
	}
	if s, err := c.Stream(context.Background(), CompletionRequest{RunID: "run_1"}); err == nil {
		s.Close()
	}
	if len(seen) != 2 || seen[0] != "ops:p@ss" || seen[1] != "ops:p@ss" {
		t.Errorf("Core saw the credentials %q, want ops:p@ss on both requests", seen)
	}
}
