package core

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// WithMetrics registers the client's metrics on reg: request durations by
// endpoint template and status, the requests waiting for a connection, the
// connections opened (each a handshake over TLS: it should stay near
// core.max_connections plus the open streams, not grow with requests), and
// the gaps between frames of completions streams (Core sends no heartbeat,
// so long gaps are worth seeing).
func WithMetrics(reg prometheus.Registerer) Option {
	return func(c *Client) error {
		f := promauto.With(reg)
		req := f.NewHistogramVec(prometheus.HistogramOpts{Namespace: "toolsidecar", Subsystem: "core", Name: "request_duration_seconds",
			Help:    "Requests to Core by endpoint and status (0: transport error); for completions, until the stream opened.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}, []string{"endpoint", "status"})
		gap := f.NewHistogram(prometheus.HistogramOpts{Namespace: "toolsidecar", Subsystem: "core", Name: "stream_idle_gap_seconds",
			Help: "Silence between two frames of a completions stream.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 12)})
		f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "toolsidecar", Subsystem: "core", Name: "requests_queued",
			Help: "Short requests to Core waiting for one of the client's core.max_connections: above zero for long, Core (or the way to it) is the bottleneck."},
			func() float64 { return float64(c.queued.Load()) })
		f.NewCounterFunc(prometheus.CounterOpts{Namespace: "toolsidecar", Subsystem: "core", Name: "writes_shed_total",
			Help: "Writes that a later one makes needless (a call's processing mark) not sent because core.max_connections requests already waited for Core."},
			func() float64 { return float64(c.shed.Load()) })
		for use, n := range map[string]*atomic.Int64{"calls": &c.dialed, "streams": &c.streamsDialed} {
			f.NewCounterFunc(prometheus.CounterOpts{Namespace: "toolsidecar", Subsystem: "core", Name: "connections_opened_total",
				Help:        "Connections the sidecar opened to Core: for its short calls, or for completions streams and requests on others' behalf (proxy, probe); not counted with WithHTTPClient.",
				ConstLabels: prometheus.Labels{"use": use}}, func() float64 { return float64(n.Load()) })
		}
		prev := c.observe
		c.observe = func(endpoint string, status int, d time.Duration) {
			prev(endpoint, status, d)
			req.WithLabelValues(endpoint, strconv.Itoa(status)).Observe(d.Seconds())
		}
		c.gap = func(d time.Duration) { gap.Observe(d.Seconds()) }
		return nil
	}
}
