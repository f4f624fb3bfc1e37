package executor_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
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
	h := newHarnessWith(t, twoTurns(calls("rec", "rec")...), testenv.Options{Sidecar: []sidecar.Option{sidecar.WithTracerProvider(tp)}},
		spec{config.Tool{Name: "rec"}, record})
	began := time.Now()
	if _, err := h.drive(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := sr.Ended()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if len(byName["toolsidecar.drive"]) != 1 || len(byName["toolsidecar.turn"]) != 2 || len(byName["execute_tool rec"]) != 2 {
		t.Fatalf("spans %v", byName)
	}
	drive := byName["toolsidecar.drive"][0]
	traceID := drive.SpanContext().TraceID()
	callIDs := map[string]bool{}
	for _, c := range byName["execute_tool rec"] {
		if c.SpanContext().TraceID() != traceID || c.Parent().SpanID() != byName["toolsidecar.turn"][0].SpanContext().SpanID() {
			t.Errorf("call span %v not under the first turn", c.SpanContext())
		}
		attrs := map[string]string{}
		for _, a := range c.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
		}
		if c.SpanKind() != trace.SpanKindInternal || attrs["gen_ai.operation.name"] != "execute_tool" || attrs["gen_ai.tool.name"] != "rec" ||
			!strings.HasPrefix(attrs["gen_ai.tool.call.id"], "call_") {
			t.Errorf("call span kind %v, attributes %v: want GenAI's execute_tool conventions", c.SpanKind(), attrs)
		}
		callIDs[c.SpanContext().SpanID().String()] = true
	}
	// Every request to Core is a client span of the drive's trace, and
	// carries it to Core as traceparent.
	clients := 0
	for _, s := range spans {
		if s.SpanKind() == trace.SpanKindClient {
			clients++
			if s.SpanContext().TraceID() != traceID {
				t.Errorf("Core request span %q outside the drive's trace", s.Name())
			}
		}
	}
	for _, r := range h.sim.Requests() {
		if r.At.Before(began) {
			continue // the test's own set-up
		}
		if !strings.Contains(r.Traceparent, traceID.String()) {
			t.Errorf("%s %s reached Core without the drive's traceparent (%q)", r.Method, r.Path, r.Traceparent)
		}
	}
	if clients == 0 {
		t.Error("no client span for the requests to Core")
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

// TestTraceContextWithoutTracing: with no tracer (the default), a caller's
// traceparent still reaches Core on every request of its drive and the
// worker of each call, and a drive without one sends Core none.
func TestTraceContextWithoutTracing(t *testing.T) {
	workerSaw := make(chan string, 2)
	record := func(_ context.Context, c *tool.Call) ([]byte, error) {
		workerSaw <- c.Traceparent
		return []byte(`"ok"`), nil
	}
	h := newHarness(t, twoTurns(calls("rec")...), config.Executor{}, spec{config.Tool{Name: "rec"}, record})
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	bare := h.env.NewRun()
	began := time.Now()
	if resp, sum := testenv.Drive(t, h.env.URL, h.run, map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}); resp.StatusCode != 200 || sum.Status != "completed" {
		t.Fatalf("drive: %d, %+v", resp.StatusCode, sum)
	}
	between := time.Now()
	if resp, sum := testenv.Drive(t, h.env.URL, bare, nil); resp.StatusCode != 200 || sum.Status != "completed" {
		t.Fatalf("drive without traceparent: %d, %+v", resp.StatusCode, sum)
	}
	var traced, untraced int
	for _, r := range h.sim.Requests() {
		switch {
		case r.At.Before(began):
			continue // the test's own set-up
		case r.At.Before(between):
			traced++
			if !strings.Contains(r.Traceparent, traceID) {
				t.Errorf("%s %s reached Core without the caller's traceparent (%q)", r.Method, r.Path, r.Traceparent)
			}
		case strings.Contains(r.Path, bare.RunID) || strings.Contains(r.Path, bare.ThreadID):
			untraced++
			if r.Traceparent != "" {
				t.Errorf("%s %s carried traceparent %q, but the drive had none", r.Method, r.Path, r.Traceparent)
			}
		}
	}
	if traced < 3 || untraced < 3 {
		t.Errorf("%d requests of the traced drive and %d of the other seen, want several of each", traced, untraced)
	}
	if tp, want := <-workerSaw, "00-"+traceID+"-00f067aa0ba902b7-01"; tp != want {
		t.Errorf("the worker of the traced drive's call got traceparent %q, want the caller's %q", tp, want)
	}
	// Without a caller's, the bridge makes an unsampled one for the call.
	if tp := <-workerSaw; strings.Contains(tp, traceID) || !strings.HasSuffix(tp, "-00") {
		t.Errorf("the worker of the other drive's call got traceparent %q, want one of its own, unsampled", tp)
	}
}
