package executor

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectdavid/toolsidecar/approval"
)

// Metrics is the Prometheus [Observer] of the loop. Labels are bounded:
// tool names come from the registry (an unregistered name counts as
// "_unknown") and outcomes from the error taxonomy.
type Metrics struct {
	calls        *prometheus.CounterVec
	callSeconds  *prometheus.HistogramVec
	batchSize    prometheus.Histogram
	joinWait     prometheus.Histogram
	turns        prometheus.Histogram
	driveSeconds *prometheus.HistogramVec
	runs         *prometheus.CounterVec
	replayed     *prometheus.CounterVec
	runsFlight   prometheus.Gauge
	callsFlight  prometheus.Gauge
	attached     prometheus.Counter
	guard        prometheus.Counter
	recovered    prometheus.Counter
	budget       *prometheus.CounterVec
	deduped      *prometheus.CounterVec
	hedges       *prometheus.CounterVec
	approvals    prometheus.Gauge
	decisions    *prometheus.CounterVec
	approvalWait prometheus.Histogram
	known        func(tool string) bool

	toolsMu sync.Mutex
	tools   map[string]bool // the tools whose series exist (InitTools)
}

// latencyBuckets are the call-latency buckets: round values from 5 ms to
// 5 min, and the longest a call may take (its timeout times its attempts)
// when that is longer, so that no tool's slow calls pile into +Inf.
func latencyBuckets(longest time.Duration) []float64 {
	b := []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	if s := longest.Seconds(); s > b[len(b)-1] {
		b = append(b, s)
	}
	return b
}

// NewMetrics registers the loop's metrics on reg. known tells registered
// tool names from the model's inventions; tools are the registered ones,
// whose series start at zero (so that rate() and absent() work from the
// first scrape); longest is the longest a call may last.
func NewMetrics(reg prometheus.Registerer, known func(tool string) bool, tools []string, longest time.Duration) *Metrics {
	m := newMetrics(reg, known, latencyBuckets(longest))
	m.InitTools(tools)
	for _, st := range []string{StatusCompleted, StatusMaxTurns, StatusCancelled, StatusFailed, StatusInterrupted, StatusBudget} {
		m.runs.WithLabelValues(st)
		m.replayed.WithLabelValues(st)
	}
	for _, b := range Budgets {
		m.budget.WithLabelValues(b)
	}
	for _, o := range []string{approval.Approved, approval.Denied, approval.TimedOut, approval.Withdrawn} {
		m.decisions.WithLabelValues(o)
	}
	return m
}

// InitTools makes tools the ones with series: it starts those of new
// tools at zero (so that rate() and absent() work from the first scrape),
// and deletes those of tools that left, so that tools coming and going
// (workers' declarations) do not grow /metrics without bound. A call of a
// tool that left counts as "_unknown".
func (m *Metrics) InitTools(tools []string) {
	m.toolsMu.Lock()
	defer m.toolsMu.Unlock()
	now := make(map[string]bool, len(tools))
	for _, t := range tools {
		now[t] = true
		if !m.tools[t] {
			m.calls.WithLabelValues(t, "ok")
			m.callSeconds.WithLabelValues(t)
			m.deduped.WithLabelValues(t)
			for _, winner := range hedgeWinners {
				m.hedges.WithLabelValues(t, winner)
			}
		}
	}
	for t := range m.tools {
		if !now[t] {
			l := prometheus.Labels{"tool": t}
			m.calls.DeletePartialMatch(l)
			m.callSeconds.DeletePartialMatch(l)
			m.deduped.DeletePartialMatch(l)
			m.hedges.DeletePartialMatch(l)
		}
	}
	m.tools = now
}

func newMetrics(reg prometheus.Registerer, known func(tool string) bool, buckets []float64) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		calls: f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "calls_total",
			Help: "Tool calls by tool and outcome (ok or an error type)."}, []string{"tool", "outcome"}),
		callSeconds: f.NewHistogramVec(prometheus.HistogramOpts{Namespace: "toolsidecar", Name: "call_duration_seconds",
			Help: "Duration of a call, retries included.", Buckets: buckets}, []string{"tool"}),
		batchSize: f.NewHistogram(prometheus.HistogramOpts{Namespace: "toolsidecar", Name: "batch_size",
			Help: "Calls per batch.", Buckets: []float64{1, 2, 4, 8, 16, 32, 64}}),
		joinWait: f.NewHistogram(prometheus.HistogramOpts{Namespace: "toolsidecar", Name: "batch_join_wait_seconds",
			Help: "Time from a batch's first outcome to its last.", Buckets: buckets}),
		turns: f.NewHistogram(prometheus.HistogramOpts{Namespace: "toolsidecar", Name: "run_turns",
			Help: "Completions requests per drive.", Buckets: []float64{1, 2, 3, 4, 5, 7, 10, 15, 20}}),
		driveSeconds: f.NewHistogramVec(prometheus.HistogramOpts{Namespace: "toolsidecar", Name: "drive_duration_seconds",
			Help:    "Duration of a drive that ran, by final status (tools, turns and Core's answers).",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}}, []string{"status"}),
		runs: f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "runs_total",
			Help: "Drives by final status."}, []string{"status"}),
		runsFlight: f.NewGauge(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "runs_in_flight",
			Help: "Drives in progress."}),
		callsFlight: f.NewGauge(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "calls_in_flight",
			Help: "Calls in progress."}),
		replayed: f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "drives_replayed_total",
			Help: "Drives of runs that had already ended, answered with their state and nothing run, by status (not in runs_total)."}, []string{"status"}),
		attached: f.NewCounter(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "drives_attached_total",
			Help: "Drive requests that joined the drive of their run in progress (one driver per run)."}),
		guard: f.NewCounter(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "turn_guard_refusals_total",
			Help: "Turns refused because a call of the previous batch had no recorded outcome (a bug if ever non-zero)."}),
		recovered: f.NewCounter(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "calls_recovered_total",
			Help: "Replies kept by the durable ledger and submitted after their sidecar went away, instead of running the call again."}),
		budget: f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "budget_exceeded_total",
			Help: "Calls not dispatched because a budget refused them, by budget."}, []string{"budget"}),
		deduped: f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "calls_deduped_total",
			Help: "Calls answered from an earlier call of their run (dedupe: run), without dispatching."}, []string{"tool"}),
		hedges: f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "hedges_total",
			Help: "Straggling attempts sent a second time (hedge_after), by tool and by which copy answered first (hedge or primary)."},
			[]string{"tool", "winner"}),
		approvals: f.NewGauge(prometheus.GaugeOpts{Namespace: "toolsidecar", Name: "approvals_pending",
			Help: "Calls of this sidecar that wait for a person's approval."}),
		decisions: f.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "approval_decisions_total",
			Help: "Approvals ended, by outcome (approved, denied, timed_out, withdrawn)."}, []string{"outcome"}),
		approvalWait: f.NewHistogram(prometheus.HistogramOpts{Namespace: "toolsidecar", Name: "approval_wait_seconds",
			Help: "Time from an approval's request to its decision.", Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 86400}}),
		known: known,
	}
}

// ApprovalWaiting implements [Observer].
func (m *Metrics) ApprovalWaiting(delta int) { m.approvals.Add(float64(delta)) }

// ApprovalDecided implements [Observer].
func (m *Metrics) ApprovalDecided(outcome string, waited time.Duration) {
	m.decisions.WithLabelValues(outcome).Inc()
	m.approvalWait.Observe(waited.Seconds())
}

// hedgeWinners are the values of hedges_total's winner label.
var hedgeWinners = []string{"hedge", "primary"}

// Hedged implements [Observer].
func (m *Metrics) Hedged(tool string, won bool) {
	winner := "primary"
	if won {
		winner = "hedge"
	}
	m.hedges.WithLabelValues(m.label(tool), winner).Inc()
}

// CallDeduped implements [Observer].
func (m *Metrics) CallDeduped(tool string) { m.deduped.WithLabelValues(m.label(tool)).Inc() }

// BudgetExceeded implements [Observer].
func (m *Metrics) BudgetExceeded(budget string) { m.budget.WithLabelValues(budget).Inc() }

// CallRecovered implements [Observer].
func (m *Metrics) CallRecovered() { m.recovered.Inc() }

// DriveAttached implements [Observer].
func (m *Metrics) DriveAttached() { m.attached.Inc() }

// GuardTripped implements [Observer].
func (m *Metrics) GuardTripped() { m.guard.Inc() }

func (m *Metrics) label(tool string) string {
	if m.known != nil && !m.known(tool) {
		return "_unknown"
	}
	return tool
}

// CallDone implements [Observer].
func (m *Metrics) CallDone(ctx context.Context, tool, outcome string, d time.Duration) {
	tool = m.label(tool)
	m.calls.WithLabelValues(tool, outcome).Inc()
	observe(ctx, m.callSeconds.WithLabelValues(tool), d.Seconds())
}

// observe records v with the trace of ctx as its exemplar when that trace
// is sampled (its spans exist to be found), so that a slow bucket in
// OpenMetrics links to a trace of a call that fell in it.
func observe(ctx context.Context, o prometheus.Observer, v float64) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	o.Observe(v)
}

// BatchDone implements [Observer].
func (m *Metrics) BatchDone(size int, wait time.Duration) {
	m.batchSize.Observe(float64(size))
	m.joinWait.Observe(wait.Seconds())
}

// RunStarted implements [Observer].
func (m *Metrics) RunStarted() { m.runsFlight.Inc() }

// RunReplayed implements [Observer].
func (m *Metrics) RunReplayed(status string) { m.replayed.WithLabelValues(status).Inc() }

// RunDone implements [Observer].
func (m *Metrics) RunDone(ctx context.Context, status string, turns int, d time.Duration) {
	m.runsFlight.Dec()
	m.runs.WithLabelValues(status).Inc()
	m.turns.Observe(float64(turns))
	observe(ctx, m.driveSeconds.WithLabelValues(status), d.Seconds())
}

// CallsInFlight implements [Observer].
func (m *Metrics) CallsInFlight(delta int) { m.callsFlight.Add(float64(delta)) }
