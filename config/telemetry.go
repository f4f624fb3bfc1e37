package config

// Tracing configures OpenTelemetry tracing, off unless an endpoint is set.
type Tracing struct {
	// OTLPEndpoint is an OTLP/HTTP collector, host:port. Empty: no tracing.
	OTLPEndpoint string `koanf:"otlp_endpoint"`
	// Insecure sends to the collector over plain HTTP. default: false
	Insecure bool `koanf:"insecure"`
	// ServiceName is the service.name resource. default: toolsidecar
	ServiceName string `koanf:"service_name"`
	// SampleRatio of new traces (a caller's sampled trace is always
	// followed). default: 1
	SampleRatio float64 `koanf:"sample_ratio"`
}

func (t Tracing) validate() []error {
	p := problems{prefix: "tracing"}
	p.hostPort("otlp_endpoint", t.OTLPEndpoint, true)
	if t.SampleRatio < 0 || t.SampleRatio > 1 {
		p.add("sample_ratio", "must be between 0 and 1, got %v", t.SampleRatio)
	}
	return p.list
}
