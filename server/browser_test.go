package server_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/server"
)

// TestBrowserDefenses: without a token (the shipped default), the API
// refuses what a web page in the user's browser could send it: a Host that
// is not the sidecar's (DNS rebinding), on every route; a state-changing
// request another site sent; a body not sent as JSON. Clients that are not
// browsers, and the sidecar's own page, pass.
func TestBrowserDefenses(t *testing.T) {
	store := approval.NewMemory()
	now := time.Now().UTC()
	if _, err := store.Open(context.Background(), approval.Request{ActionID: "act_1", RunID: "run_1", Tool: "pay",
		RequestedAt: now, Deadline: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Approvals: store, AllowedHosts: []string{"sidecar.internal"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	ops := httptest.NewServer(srv.Ops())
	defer ops.Close()
	self := strings.TrimPrefix(ts.URL, "http://")
	approve := `{"decision": "approve"}`
	for _, c := range []struct {
		name, base, method, path, host, body string
		header                               map[string]string
		want                                 int
	}{
		{"rebound name reads approvals", ts.URL, "GET", "/v1/approvals", "attacker.example:80", "", nil, 403},
		{"rebound name reads the live events", ts.URL, "GET", "/ui/events", "attacker.example", "", nil, 403},
		{"rebound name on the ops listener", ops.URL, "GET", "/metrics", "attacker.example", "", nil, 403},
		{"rebound name approves", ts.URL, "POST", "/v1/approvals/act_1", "attacker.example", approve, map[string]string{"Content-Type": "application/json"}, 403},
		{"form post from another site", ts.URL, "POST", "/v1/approvals/act_1", "", approve,
			map[string]string{"Content-Type": "text/plain", "Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site"}, 403},
		{"a page on another port (same site)", ts.URL, "POST", "/v1/approvals/act_1", "", approve,
			map[string]string{"Content-Type": "application/json", "Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"}, 403},
		{"an old browser's cross-origin post", ts.URL, "POST", "/v1/approvals/act_1", "", approve,
			map[string]string{"Content-Type": "application/json", "Origin": "http://attacker.example"}, 403},
		{"text/plain without browser headers", ts.URL, "POST", "/v1/approvals/act_1", "", approve, map[string]string{"Content-Type": "text/plain"}, 415},
		{"no content type", ts.URL, "POST", "/v1/approvals/act_1", "", approve, nil, 415},
		{"a form's content type", ts.URL, "POST", "/v1/approvals/act_1", "", approve, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"loopback name reads", ts.URL, "GET", "/v1/approvals", "localhost:8080", "", nil, 200},
		{"an allowed name reads", ts.URL, "GET", "/v1/approvals", "sidecar.internal:8080", "", nil, 200},
		{"an IP address reads", ts.URL, "GET", "/healthz", "10.1.2.3:9090", "", nil, 200},
		{"the probe of a kubelet on the ops listener", ops.URL, "GET", "/healthz", "10.1.2.3:9090", "", nil, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := send(t, c.base, c.method, c.path, c.host, c.body, c.header)
			if code != c.want {
				t.Errorf("%d %s, want %d", code, body, c.want)
			}
		})
	}
	if es, _ := store.Pending(context.Background()); len(es) != 1 {
		t.Fatalf("the approval was decided by a refused request: %+v", es)
	}
	// The sidecar's own page: same origin, JSON.
	code, body := send(t, ts.URL, "POST", "/v1/approvals/act_1", self, approve,
		map[string]string{"Content-Type": "application/json", "Origin": ts.URL, "Sec-Fetch-Site": "same-origin"})
	if code != 200 {
		t.Errorf("the page's own approval: %d %s", code, body)
	}
}

func send(t *testing.T, base, method, path, host, body string, header map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	if body == "" {
		req.Body = nil
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
