package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/version"
)

// propagator reads and writes W3C trace context and baggage: on the API
// (a caller's traceparent), to Core and to workers.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// tracerProvider builds OpenTelemetry's tracer provider: a no-op unless
// tracing.otlp_endpoint is set or the standard OTEL_EXPORTER_OTLP_ENDPOINT
// (or _TRACES_ENDPOINT) variable is. The exporter reads the other standard
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, TLS); the resource
// takes OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, the host and the
// SDK; OTEL_TRACES_SAMPLER, when set, replaces tracing.sample_ratio.
// Shutdown flushes the spans still buffered.
func tracerProvider(cfg config.Tracing) (trace.TracerProvider, func(context.Context) error, error) {
	fromEnv := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	if cfg.OTLPEndpoint == "" && !fromEnv {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	exp, err := exporter(cfg)
	if err != nil {
		return nil, nil, err
	}
	res, err := resource.New(context.Background(),
		resource.WithAttributes(attribute.String("service.name", cfg.ServiceName), attribute.String("service.version", version.Get().Version)),
		resource.WithFromEnv(), resource.WithHost(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, err
	}
	popts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if os.Getenv("OTEL_TRACES_SAMPLER") == "" { // else the SDK reads OTEL_TRACES_SAMPLER(_ARG)
		popts = append(popts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))))
	}
	tp := sdktrace.NewTracerProvider(popts...)
	return tp, tp.Shutdown, nil
}

// exporter is the OTLP span exporter of the protocol the environment asks
// for (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL):
// grpc, or http/protobuf, the specification's default. Any other protocol
// (http/json, which Go's SDK does not speak) is refused at start-up, not
// ignored. New does not connect: the exporter dials when it first sends.
func exporter(cfg config.Tracing) (sdktrace.SpanExporter, error) {
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch protocol {
	case "", "http/protobuf":
		var opts []otlptracehttp.Option
		if cfg.OTLPEndpoint != "" { // the file's endpoint wins over the environment's
			opts = append(opts, otlptracehttp.WithEndpoint(cfg.OTLPEndpoint))
			if cfg.Insecure {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		return otlptracehttp.New(context.Background(), opts...)
	case "grpc":
		var opts []otlptracegrpc.Option
		if cfg.OTLPEndpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint))
			if cfg.Insecure {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		return otlptracegrpc.New(context.Background(), opts...)
	}
	return nil, fmt.Errorf("tracing: OTLP protocol %q is not supported: use grpc or http/protobuf", protocol)
}

// coreTransport makes the requests to Core carry the drive's trace
// context. With spans recorded, each request is a client span of the drive
// (otelhttp). Without (the default), otelhttp would still clone each
// request, time it and build its metric attributes for nothing: about 7 %
// of the sidecar's CPU under load (BENCHMARKS.md), so the context is
// passed on by a transport that does only that.
func coreTransport(tp trace.TracerProvider, rt http.RoundTripper) http.RoundTripper {
	if _, off := tp.(noop.TracerProvider); off {
		return propagating{rt}
	}
	return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagator))
}

// propagating writes a request's trace context and baggage, when it has
// any (a caller's traceparent), into its headers, as otelhttp would.
type propagating struct{ next http.RoundTripper }

func (p propagating) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	if trace.SpanContextFromContext(ctx).IsValid() || baggage.FromContext(ctx).Len() > 0 {
		r = r.Clone(ctx) // a RoundTripper must not modify its request
		propagator.Inject(ctx, propagation.HeaderCarrier(r.Header))
	}
	return p.next.RoundTrip(r)
}
