package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestDurationsAndTraceIDs: a duration is written as Go writes it, and a
// record logged inside a span carries that span's ids; one outside, none.
func TestDurationsAndTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "json", 0)
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	log.With("component", "x").InfoContext(ctx, "inside", "took", 1500*time.Millisecond)
	span.End()
	log.Info("outside")
	dec := json.NewDecoder(&buf)
	var in, out map[string]any
	if err := dec.Decode(&in); err != nil {
		t.Fatal(err)
	}
	dec.Decode(&out)
	if in["took"] != "1.5s" || in["trace_id"] != span.SpanContext().TraceID().String() || in["span_id"] != span.SpanContext().SpanID().String() {
		t.Errorf("inside the span: %v", in)
	}
	if _, has := out["trace_id"]; has {
		t.Errorf("outside any span: %v", out)
	}
	if _, err := New(&buf, "xml", 0); err == nil {
		t.Error("format xml accepted")
	}
}
