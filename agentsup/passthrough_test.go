package agentsup_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// recorder is an upstream that records every request as it arrived and
// answers a create of a session with createBody (CORS grants included,
// as a permissive upstream would send them).
type recorder struct {
	createBody string
	mu         sync.Mutex
	reqs       []recorded
}

type recorded struct {
	method, uri string
	header      http.Header
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, recorded{r.Method, r.RequestURI, r.Header.Clone()})
	rc.mu.Unlock()
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Header().Set("Access-Control-Allow-Headers", "authorization, x-api-key, content-type")
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodPost && (strings.HasSuffix(r.URL.Path, "/agents/sessions") || r.URL.Path == "/v1/sessions") {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, rc.createBody)
		return
	}
	w.WriteHeader(http.StatusNotFound)
	_, _ = io.WriteString(w, `{"error":{"message":"no"}}`)
}

func (rc *recorder) all() []recorded {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]recorded(nil), rc.reqs...)
}

const (
	sidecarToken   = "tsc-token-SECRET"
	ownUpstreamKey = "sk-sidecar-own"
)

// passThrough starts a sidecar of kind, with the API token and, when own,
// a key of its own, in front of rc; it returns the sidecar's base URL and
// the path of a create of a session.
func passThrough(t *testing.T, kind string, rc *recorder, own bool) (base, create string) {
	t.Helper()
	up := httptest.NewServer(rc)
	t.Cleanup(up.Close)
	upURL, create := up.URL, "/v1/sessions"
	if kind == config.UpstreamOpenAIAgents {
		upURL, create = up.URL+"/v1", "/v1/agents/sessions"
	}
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(ownUpstreamKey), 0o600); err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, coresim.Scenario{}, testenv.Options{Token: sidecarToken, Config: func(c *config.Config) {
		c.Upstream.Kind, c.Upstream.URL, c.Upstream.RetryBudget = kind, upURL, 2*time.Second
		if own {
			c.Upstream.APIKeyFile = keyFile
		}
	}})
	return env.URL, create
}

func do(t *testing.T, method, url, body string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+sidecarToken)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestPassThroughBoundaries: what the pass-through keeps from the
// upstream, on both kinds, with the sidecar's API token on. The token
// never leaves for the upstream (the sidecar's own key does); a path
// whose encoded slash or dot segment would leave the API's prefix once
// decoded is refused before the upstream sees it; a browser's preflight
// gets no grant, neither the sidecar's nor the upstream's relayed; and a
// create's answer larger than the sidecar reads for its id reaches the
// caller whole.
func TestPassThroughBoundaries(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		big := `{"id":"sess_big","status":"idle","pad":"` + strings.Repeat("x", 2<<20) + `"}`
		rc := &recorder{createBody: big}
		base, create := passThrough(t, kind, rc, true)

		resp, body := do(t, http.MethodPost, base+create, `{"agent":"a"}`)
		if resp.StatusCode != http.StatusCreated || body != big {
			t.Errorf("a create of %d bytes: HTTP %d, %d bytes back; want 201 and the whole body", len(big), resp.StatusCode, len(body))
		}
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "" {
			t.Errorf("the upstream's CORS grant was relayed: Access-Control-Allow-Origin %q", got)
		}

		escapes := []string{"..%2Ffiles", "..%2fmessages", "%2E%2E%2F%2E%2E%2Fv1%2Ffiles", "a%2Fb", "a%5Cb"}
		prefix := "/v1/sessions/"
		if kind == config.UpstreamOpenAIAgents {
			prefix = "/v1/agents/"
		}
		for _, p := range escapes {
			if resp, body := do(t, http.MethodPost, base+prefix+p, `{}`); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("POST %s%s: HTTP %d %s, want 400", prefix, p, resp.StatusCode, body)
			}
		}
		resp, _ = do(t, http.MethodOptions, base+create, "", "Origin", "https://evil.example", "Access-Control-Request-Method", "POST")
		if resp.StatusCode/100 == 2 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("a preflight: HTTP %d, Access-Control-Allow-Origin %q; want a refusal and no grant", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
		}

		reqs := rc.all()
		if len(reqs) != 1 {
			t.Errorf("the upstream got %d requests, want only the create: %+v", len(reqs), reqs)
		}
		for _, r := range reqs {
			for name, vs := range r.header {
				for _, v := range vs {
					if strings.Contains(v, sidecarToken) {
						t.Errorf("the sidecar's token reached the upstream in %s (%s %s)", name, r.method, r.uri)
					}
				}
			}
			key := r.header.Get("X-Api-Key")
			if kind == config.UpstreamOpenAIAgents {
				key = strings.TrimPrefix(r.header.Get("Authorization"), "Bearer ")
			}
			if key != ownUpstreamKey {
				t.Errorf("%s %s went with key %q, want the sidecar's own", r.method, r.uri, key)
			}
		}
	})
}

// TestTokenIsNotAnUpstreamKey: on anthropic-agents without a key of the
// sidecar's own, callers send their key in x-api-key and the sidecar's
// token in Authorization; the key goes upstream, the token does not.
func TestTokenIsNotAnUpstreamKey(t *testing.T) {
	rc := &recorder{createBody: `{"id":"sess_1","status":"idle"}`}
	base, create := passThrough(t, config.UpstreamAnthropicAgents, rc, false)
	if resp, body := do(t, http.MethodPost, base+create, `{"agent":"a"}`, "X-Api-Key", appKey); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: HTTP %d %s", resp.StatusCode, body)
	}
	for _, r := range rc.all() {
		if auth := r.header.Get("Authorization"); auth != "" {
			t.Errorf("%s %s went upstream with Authorization %q: the sidecar's token", r.method, r.uri, auth)
		}
		if got := r.header.Get("X-Api-Key"); got != appKey {
			t.Errorf("%s %s went upstream with x-api-key %q, want the caller's", r.method, r.uri, got)
		}
	}
	if len(rc.all()) == 0 {
		t.Error("nothing reached the upstream")
	}
}
