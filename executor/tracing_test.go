package executor_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/testenv"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/tool"
)

// TestTracing: with a tracer, a drive records drive > turn > call spans,
// and each worker receives its call span as traceparent.
func TestTracing(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	record := func(ctx context.Context, c *tool.Call) ([]byte, error) {
		mu.Lock()
		seen = append(seen, c.Traceparent)
		mu.Unlock()
		return []byte(`"ok"`), nil
	}
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())
	h := newHarnessWith(t, twoTurns(calls("rec", "rec")...), testenv.Options{Sidecar: []sidecar.Option{sidecar.WithTracer(tp.Tracer("test"))}},
		spec{config.Tool{Name: "rec"}, record})
	if _, err := h.drive(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := sr.Ended()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if len(byName["toolsidecar.drive"]) != 1 || len(byName["toolsidecar.turn"]) != 2 || len(byName["toolsidecar.call"]) != 2 {
		t.Fatalf("spans %v", byName)
	}
	drive := byName["toolsidecar.drive"][0]
	traceID := drive.SpanContext().TraceID()
	callIDs := map[string]bool{}
	for _, c := range byName["toolsidecar.call"] {
		if c.SpanContext().TraceID() != traceID || c.Parent().SpanID() != byName["toolsidecar.turn"][0].SpanContext().SpanID() {
			t.Errorf("call span %v not under the first turn", c.SpanContext())
		}
		callIDs[c.SpanContext().SpanID().String()] = true
	}
	if len(seen) != 2 {
		t.Fatalf("worker saw %d calls", len(seen))
	}
	for _, tp := range seen {
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[1] != traceID.String() || !callIDs[parts[2]] {
			t.Errorf("worker traceparent %q is not a call span of trace %s", tp, traceID)
		}
	}
}
