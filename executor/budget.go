package executor

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/projectdavid/toolsidecar/config"
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

// budget is what one drive of a run has spent, against its bounds. Calls
// are admitted in the order the model made them, as they stream in.
type budget struct {
	cfg config.RunBudget

	mu          sync.Mutex
	calls       int
	toolTime    time.Duration
	resultBytes int64
	perTool     map[string]int
	refused     int
	stop        bool // on_budget stop, and a call was refused
}

func newBudget(cfg config.RunBudget) *budget {
	return &budget{cfg: cfg, perTool: map[string]int{}}
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

// spendBudget is the budget policy's second half: a call that ran counts
// its time and the size of its result against the run's budget (whether
// the call may run at all was decided as its manifest arrived, in the
// model's order).
func (e *Executor) spendBudget(next dispatchFunc) dispatchFunc {
	return func(ctx context.Context, c *call, o *outcome) tool.Outcome {
		b := c.b.req.budget
		if b == nil {
			return next(ctx, c, o)
		}
		start := time.Now()
		reply := next(ctx, c, o)
		size := len(reply.Data)
		if reply.Err != nil {
			size = len(reply.Err.Message)
		}
		b.spend(time.Since(start), size)
		return reply
	}
}

// admit counts a call against the run's and the tool's budgets, or refuses
// it with the error the model reads (which budget, what is used, what is
// left) and the budget's label.
func (e *Executor) admit(b *budget, def *registry.Tool) (*tool.Error, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, name, perRun := b.cfg, def.Name, def.Config.MaxCallsPerRun
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
		if wait, ok := e.rates.take(def); !ok {
			err, which = tool.NewError(tool.BudgetExceeded, "tool rate exceeded: %s is called at most %g times per second across all runs; the next call is possible in %s",
				name, def.Config.Rate, wait.Round(time.Millisecond)), BudgetToolRate
		}
	}
	if err != nil {
		b.refused++
		b.stop = b.stop || c.OnBudget == config.OnBudgetStop
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
	per, burst := def.Config.Rate, def.Config.RateBurst
	if per <= 0 {
		return 0, true
	}
	if burst < 1 {
		burst = 1
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
func budgeted(c config.RunBudget, reg *registry.Registry) bool {
	if c.MaxCalls > 0 || c.MaxToolTime > 0 || c.MaxResultBytes > 0 {
		return true
	}
	for _, t := range reg.Tools() {
		if t.Config.MaxCallsPerRun > 0 || t.Config.Rate > 0 {
			return true
		}
	}
	return false
}
