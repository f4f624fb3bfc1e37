package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// FuzzAPI sends what a hostile caller may send to a whole sidecar (a real
// HTTP server, the Core simulator, NATS and a worker behind it): any
// method, path, Host, Origin, Content-Type and body, on the shipped
// default (no token). Whatever comes, the answer is never a 500, an error
// quotes no long run of what was sent, and the sidecar stays live and ready
// (a long id used to cut it off from NATS for good). make fuzz runs it;
// make test runs its seeds.
func FuzzAPI(f *testing.F) {
	long := strings.Repeat("a", 5000)
	for _, s := range []struct{ method, path, host, origin, ctype, body string }{
		{"POST", "/v1/approvals/" + long, "", "", "application/json", `{"decision":"approve"}`},
		{"POST", "/v1/approvals/act.a.*", "", "", "application/json", `{"decision":"approve"}`},
		{"POST", "/v1/approvals/act_1", "", "http://evil.example", "text/plain", `{"decision":"approve"}`},
		{"GET", "/v1/approvals", "evil.example:8080", "", "", ""},
		{"POST", "/v1/runs/" + long + "/drive", "", "", "application/json", `{"thread_id":"t","assistant_id":"a","message_id":"m","model":"x"}`},
		{"POST", "/v1/runs/run_1/drive", "", "", "application/json", `{"thread_id":"` + long + `","assistant_id":"a","message_id":"m","model":"x"}`},
		{"POST", "/v1/runs/run_1/drive", "", "", "application/json", `{"thread_id":"t\u001b","assistant_id":"a","message_id":"m","model":"x","` + long + `":1}`},
		{"POST", "/v1/completions", "", "", "application/json", `{"run_id":"` + long + `","stream":true}`},
		{"POST", "/v1/completions", "", "", "application/json", "{\"run_id\":\"r\xff\"}"},
		{"GET", "/v1/runs/" + long, "", "", "", ""},
		{"GET", "/v1/sidecar/runs/" + long, "", "", "", ""},
		{"GET", "/v1/sidecar/runs/run.a.*%00" + long[:300], "", "", "", ""},
		{"GET", "/v1/sidecar/runs", "evil.example", "http://evil.example", "", ""},
		{"GET", "/ui/events", "", "", "", ""},
		{"POST", "/mcp", "", "", "application/json", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + long + `"}}`},
		{"DELETE", "/%2e%2e/%00", "", "", "", ""},
	} {
		f.Add(s.method, s.path, s.host, s.origin, s.ctype, []byte(s.body))
	}
	env := testenv.Start(f, threeCalls(), testenv.Options{}, standardTools()...)
	// A stream (the live view's events, a drive over SSE) answers its
	// headers at once and goes on: only those are waited for.
	client := &http.Client{Timeout: 10 * time.Second}
	f.Cleanup(client.CloseIdleConnections)
	f.Fuzz(func(t *testing.T, method, path, host, origin, ctype string, body []byte) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#?") || !utf8.ValidString(path) {
			return // not a request line a client sends
		}
		req, err := http.NewRequest(method, env.URL+path, bytes.NewReader(body))
		if err != nil {
			return
		}
		for k, v := range map[string]string{"Origin": origin, "Content-Type": ctype} {
			if v != "" && !strings.ContainsAny(v, "\r\n\x00") {
				req.Header.Set(k, v)
			}
		}
		if host != "" && !strings.ContainsAny(host, "\r\n\x00 /") {
			req.Host = host
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.Do(req.WithContext(ctx))
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s %s: no answer within 10 s", method, path)
		}
		if err != nil {
			return // refused by the client's own checks, or the connection
		}
		var answer []byte
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			answer, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusInternalServerError {
			t.Fatalf("%s %s: 500 %s", method, path, answer)
		}
		if resp.StatusCode >= 400 {
			for _, sent := range []string{path, string(body)} {
				if run := longestRun(sent); len(run) >= 200 && bytes.Contains(answer, []byte(run)) {
					t.Fatalf("%s %s: the %d answer quotes %d bytes of what was sent", method, path, resp.StatusCode, len(run))
				}
			}
		}
		for _, probe := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(env.URL + probe)
			if err != nil {
				t.Fatalf("after %s %s: %s: %v", method, path, probe, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("after %s %s: %s answered %d", method, path, probe, resp.StatusCode)
			}
		}
	})
}

// longestRun is the longest run of one byte in s, the shape of the long
// ids the seeds send.
func longestRun(s string) string {
	best, start := "", 0
	for i := 1; i <= len(s); i++ {
		if i == len(s) || s[i] != s[start] {
			if i-start > len(best) {
				best = s[start:i]
			}
			start = i
		}
	}
	return best
}
