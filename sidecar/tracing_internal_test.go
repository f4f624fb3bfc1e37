package sidecar

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

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

// collector is an OTLP/gRPC trace collector that counts the spans it gets.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	spans chan int
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	n := 0
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			n += len(ss.Spans)
		}
	}
	c.spans <- n
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// TestTracingProtocols: OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports over
// gRPC (a real collector receives the span), and a protocol the SDK does
// not speak is refused at start-up, naming it, instead of being ignored.
func TestTracingProtocols(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{spans: make(chan int, 4)}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	go srv.Serve(ln)
	defer srv.Stop()

	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	tp, stop, err := tracerProvider(config.Tracing{ServiceName: "toolsidecar", SampleRatio: 1, OTLPEndpoint: ln.Addr().String(), Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tp.Tracer("t").Start(context.Background(), "s")
	span.End()
	if err := stop(context.Background()); err != nil { // flushes
		t.Fatal(err)
	}
	select {
	case n := <-c.spans:
		if n != 1 {
			t.Errorf("the gRPC collector received %d spans, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gRPC collector received nothing")
	}

	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, _, err := tracerProvider(config.Tracing{ServiceName: "toolsidecar", SampleRatio: 1, OTLPEndpoint: "127.0.0.1:4318"}); err == nil ||
		!strings.Contains(err.Error(), `"http/json"`) {
		t.Errorf("http/json: %v, want a start-up error naming it", err)
	}
}
