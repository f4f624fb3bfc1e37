package sidecar

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projectdavid/toolsidecar/config"
)

// TestTracingFromOTELEnv: with no endpoint in the file, the standard
// OTEL_EXPORTER_OTLP_ENDPOINT turns tracing on, and OTEL_SERVICE_NAME names
// the service; without either, tracing is a no-op.
func TestTracingFromOTELEnv(t *testing.T) {
	tp, stop, err := tracerProvider(config.Tracing{ServiceName: "toolsidecar", SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tp.(noop.TracerProvider); !ok {
		t.Errorf("no endpoint anywhere: provider %T, want no-op", tp)
	}
	stop(context.Background())

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_SERVICE_NAME", "assistant-tools")
	tp, stop, err = tracerProvider(config.Tracing{ServiceName: "toolsidecar", SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	sdk, ok := tp.(*sdktrace.TracerProvider)
	if !ok {
		t.Fatalf("provider %T, want the SDK's", tp)
	}
	_, span := sdk.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	ro := span.(sdktrace.ReadOnlySpan)
	var name string
	for _, a := range ro.Resource().Attributes() {
		if a.Key == "service.name" {
			name = a.Value.AsString()
		}
	}
	if name != "assistant-tools" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", name)
	}
}
