package executor

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// The budgets a call can exceed: the label of toolsidecar_budget_exceeded_total.
const (
	BudgetRunCalls       = "run_calls"
	BudgetRunToolTime    = "run_tool_time"
	BudgetRunResultBytes = "run_result_bytes"
	BudgetToolCalls      = "tool_calls"
	BudgetToolRate       = "tool_rate"
)

// Budgets lists every budget label.
var Budgets = []string{BudgetRunCalls, BudgetRunToolTime, BudgetRunResultBytes, BudgetToolCalls, BudgetToolRate}

// StatusBudget: a call exceeded a budget under run_budget.on_budget stop;
// its batch was joined and submitted, and no further turn was requested.
const StatusBudget = "budget_exceeded"

// budgets is the budget policy: calls are admitted against the run's and
// the tool's budgets in the order the model made them, as they stream in,
// and each call that ran counts its time and the size of its result.
type budgets struct {
	e     *Executor
	rates rates // the tools' rate budgets, across runs
	// on caches, for the registry in force, whether any budget applies
	// to drives.
	on atomic.Pointer[budgetsOn]
}

type budgetsOn struct {
	reg *registry.Registry
	yes bool
}

// budget is what one drive of a run has spent, against its bounds.
type budget struct {
	cfg RunBudget

	mu          sync.Mutex
	calls       int
	toolTime    time.Duration
	resultBytes int64
	perTool     map[string]int
	refused     int
	stop        bool // on_budget stop, and a call was refused
}

func (p *budgets) of(d *scope) *budget {
	return d.get(p, func() any { return &budget{cfg: p.e.cfg.RunBudget, perTool: map[string]int{}} }).(*budget)
}

// concerns: a call of a registered tool that passed its check, when any
// budget applies to drives (then every such call is counted, for the
// drive's report).
func (p *budgets) concerns(in *callIn) bool {
	return in.Tool != nil && in.Check == nil && p.applies()
}

// applies reports whether any budget applies to drives under the
// registry in force.
func (p *budgets) applies() bool {
	reg := p.e.tools.Load()
	if on := p.on.Load(); on != nil && on.reg == reg {
		return on.yes
	}
	on := &budgetsOn{reg: reg, yes: budgeted(p.e.cfg.RunBudget, reg)}
	p.on.Store(on)
	return on.yes
}

// admit counts the call against the budgets, or refuses it.
func (p *budgets) admit(in *callIn) *tool.Error {
	err, which := p.take(p.of(in.Drive), in.Tool)
	if err != nil {
		p.e.obs.BudgetExceeded(which)
		callLog(in.Log, in.ToolCall).Info("call refused by a budget", "budget", which)
	}
	return err
}

// intercept counts a call's time and the size of its result.
func (p *budgets) intercept(ctx context.Context, in *callIn, next step) answer {
	start := time.Now()
	a := next(ctx, in)
	size := len(a.Data)
	if a.Err != nil {
		size = len(a.Err.Message)
	}
	p.of(in.Drive).spend(time.Since(start), size)
	return a
}

// stops ends the drive once a call was refused under on_budget: stop.
func (p *budgets) stops(d *scope) (string, string) {
	if p.of(d).stopped() {
		return StatusBudget, "a call exceeded its budget and run_budget.on_budget is stop: no further turn was requested"
	}
	return "", ""
}

// report adds the drive's spending, when any budget applies to drives.
func (p *budgets) report(d *scope, sum *Summary) {
	if p.applies() {
		sum.Budget = p.of(d).report()
	}
}

// BudgetReport is a drive's spending against its bounds, in its summary.
type BudgetReport struct {
	Calls          int            `json:"calls"`
	MaxCalls       int            `json:"max_calls,omitempty"`
	ToolTimeMS     int64          `json:"tool_time_ms"`
	MaxToolTimeMS  int64          `json:"max_tool_time_ms,omitempty"`
	ResultBytes    int64          `json:"result_bytes"`
	MaxResultBytes int64          `json:"max_result_bytes,omitempty"`
	ToolCalls      map[string]int `json:"tool_calls"`
	// Refused counts the calls not dispatched for a budget.
	Refused int `json:"refused"`
}

func (b *budget) report() *BudgetReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := &BudgetReport{Calls: b.calls, MaxCalls: b.cfg.MaxCalls, ToolTimeMS: b.toolTime.Milliseconds(), MaxToolTimeMS: b.cfg.MaxToolTime.Milliseconds(),
		ResultBytes: b.resultBytes, MaxResultBytes: b.cfg.MaxResultBytes, ToolCalls: map[string]int{}, Refused: b.refused}
	for k, v := range b.perTool {
		r.ToolCalls[k] = v
	}
	return r
}

// stopped reports that the drive must end for a budget instead of asking
// for another turn.
func (b *budget) stopped() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stop
}

// spend adds a finished call's time and result size.
func (b *budget) spend(d time.Duration, resultBytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.toolTime += d
	b.resultBytes += int64(resultBytes)
}

// take counts a call against the run's and the tool's budgets, or refuses
// it with the error the model reads (which budget, what is used, what is
// left) and the budget's label.
func (p *budgets) take(b *budget, def *registry.Tool) (*tool.Error, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, name, perRun := b.cfg, def.Name, def.Policies.MaxCallsPerRun
	var err *tool.Error
	var which string
	switch {
	case c.MaxCalls > 0 && b.calls >= c.MaxCalls:
		err, which = tool.NewError(tool.BudgetExceeded, "run budget exceeded: at most %d tool calls per run; %d made, none left", c.MaxCalls, b.calls), BudgetRunCalls
	case c.MaxToolTime > 0 && b.toolTime >= c.MaxToolTime:
		err, which = tool.NewError(tool.BudgetExceeded, "run budget exceeded: at most %s of tool time per run; %s used, none left",
			c.MaxToolTime, b.toolTime.Round(time.Millisecond)), BudgetRunToolTime
	case c.MaxResultBytes > 0 && b.resultBytes >= c.MaxResultBytes:
		err, which = tool.NewError(tool.BudgetExceeded, "run budget exceeded: at most %d bytes of tool results per run; %d returned, none left",
			c.MaxResultBytes, b.resultBytes), BudgetRunResultBytes
	case perRun > 0 && b.perTool[name] >= perRun:
		err, which = tool.NewError(tool.BudgetExceeded, "tool budget exceeded: %s may be called %d times per run; it was, none left; other tools may still be called",
			name, perRun), BudgetToolCalls
	default:
		if wait, ok := p.rates.take(def); !ok {
			err, which = tool.NewError(tool.BudgetExceeded, "tool rate exceeded: %s is called at most %g times per second across all runs; the next call is possible in %s",
				name, def.Policies.Rate, wait.Round(time.Millisecond)), BudgetToolRate
		}
	}
	if err != nil {
		b.refused++
		b.stop = b.stop || c.Stop
		return err, which
	}
	b.calls++
	b.perTool[name]++
	return nil, ""
}

// rates holds each tool's token bucket, shared by every run of the
// sidecar. A reload that changes a tool's rate replaces its bucket.
type rates struct {
	mu sync.Mutex
	m  map[string]*toolRate
}

type toolRate struct {
	lim   *rate.Limiter
	rate  float64
	burst int
}

// take takes a token of def's bucket; when none is left it returns how
// long until one is.
func (r *rates) take(def *registry.Tool) (time.Duration, bool) {
	per, burst := def.Policies.Rate, def.Policies.RateBurst
	if per <= 0 {
		return 0, true
	}
	r.mu.Lock()
	tr := r.m[def.Name]
	if tr == nil || tr.rate != per || tr.burst != burst {
		if r.m == nil {
			r.m = map[string]*toolRate{}
		}
		tr = &toolRate{lim: rate.NewLimiter(rate.Limit(per), burst), rate: per, burst: burst}
		r.m[def.Name] = tr
	}
	r.mu.Unlock()
	now := time.Now()
	if tr.lim.AllowN(now, 1) {
		return 0, true
	}
	res := tr.lim.ReserveN(now, 1)
	wait := res.DelayFrom(now)
	res.CancelAt(now)
	return wait, false
}

// budgeted reports whether any budget applies to drives: a run budget, or
// a tool with a budget of its own.
func budgeted(c RunBudget, reg *registry.Registry) bool {
	if c.bounded() {
		return true
	}
	for _, t := range reg.Tools() {
		if t.Policies.MaxCallsPerRun > 0 || t.Policies.Rate > 0 {
			return true
		}
	}
	return false
}
