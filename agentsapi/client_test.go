package agentsapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/projectdavid/toolsidecar/agentsapi"
)

// TestAnswerPastBoundIsFinal: a read whose answer passes MaxEventBytes
// fails with ErrTooLarge after one request: the API would send the same
// answer again, so it is not tried again as a connection error.
func TestAnswerPastBoundIsFinal(t *testing.T) {
	defer goleak.VerifyNone(t)
	var reads atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reads.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"sess_1","status":"requires_action","pad":"` + strings.Repeat("x", 4<<10) + `"}`))
	}))
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()
	api, err := agentsapi.NewOpenAI(agentsapi.Config{URL: srv.URL + "/v1", HTTP: client, MaxEventBytes: 1 << 10, IdleTimeout: time.Second, RetryBudget: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = api.Read(context.Background(), "sk-test", "sess_1")
	if !errors.Is(err, agentsapi.ErrTooLarge) {
		t.Fatalf("read: %v, want ErrTooLarge", err)
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads, want 1", n)
	}
}
