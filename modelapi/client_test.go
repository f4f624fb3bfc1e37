package modelapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/executor"
)

// TestClientPost: a turn is posted to the API's path with its key, a 5xx
// is asked again within the budget, and another refusal is not: it comes
// back with the upstream's status and the message of its error body.
func TestClientPost(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path != "/v1/messages" || r.Header.Get("X-Api-Key") != "k" || r.Header.Get("Accept") != "text/event-stream":
			http.Error(w, "wrong request", http.StatusTeapot)
		case r.Header.Get("Anthropic-Beta") == "refuse":
			http.Error(w, `{"error":{"message":"no such model"}}`, http.StatusBadRequest)
		case n.Add(1) == 1:
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	c := &Client{Codec: messagesCodec{}, URL: srv.URL, HTTP: srv.Client(), MaxErrorBytes: 1 << 10}

	resp, err := c.Post(context.Background(), []byte(`{}`), nil, "k", 10*time.Second)
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	resp.Body.Close()
	if n.Load() != 2 {
		t.Errorf("%d requests, want 2: the 503 asked again", n.Load())
	}

	_, err = c.Post(context.Background(), []byte(`{}`), http.Header{"Anthropic-Beta": {"refuse"}}, "k", 10*time.Second)
	var re *RefusedError
	if executor.UpstreamStatus(err) != http.StatusBadRequest || !errors.As(err, &re) || re.Message != "no such model" {
		t.Fatalf("refused: %v, want a 400 with the body's message", err)
	}
	if n.Load() != 2 {
		t.Errorf("%d requests, want 2: a 400 is not asked again", n.Load())
	}
}

// TestClientPostUnreachable: an upstream that refuses connections fails
// the turn once ConnectTimeout has passed, saying it cannot be reached,
// though the retry budget is far from spent.
func TestClientPostUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	url := srv.URL
	srv.Close() // nothing listens there now
	c := &Client{Codec: messagesCodec{}, URL: url, HTTP: &http.Client{}, MaxErrorBytes: 1 << 10, ConnectTimeout: 100 * time.Millisecond}
	// The budget outlasts the test's own deadline: only the connect
	// timeout can end the turn in time.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.Post(ctx, []byte(`{}`), nil, "k", time.Hour)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "cannot be reached (tried for upstream.connect_timeout, 100ms)") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("post to a closed port: %v (ctx %v)", err, ctx.Err())
	}
}
