package modelapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
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
