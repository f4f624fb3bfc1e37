package executor

import "time"

// Config is the executor's settings: data, complete when given to [New].
// The sidecar fills it from the configuration file's executor section,
// whose defaults config.Default gives; the executor restates none.
type Config struct {
	// MaxTurns bounds the turns of a drive; a request may lower it.
	MaxTurns int
	// MaxParallel bounds the calls of one batch whose tools run at once.
	MaxParallel int
	// FailRunOnMissingTool fails the drive when the model calls a tool
	// that is not registered (missing_tool: fail_run); otherwise the call
	// is answered with an error listing the tools.
	FailRunOnMissingTool bool
	// MaxArgsBytes, MaxResultBytes and MaxErrorBytes bound a call's
	// arguments, its result and the error text the model reads.
	MaxArgsBytes, MaxResultBytes, MaxErrorBytes int
	// CancelPoll and CancelPollRPS pace the reads that find a run
	// cancelled upstream while its batch runs.
	CancelPoll    time.Duration
	CancelPollRPS float64
	// SubmitBudget bounds the retries of each of a call's records.
	SubmitBudget time.Duration
	// RunBudget bounds what one drive spends on tools.
	RunBudget RunBudget
	// ClaimCheckPreviewBytes is the preview of a claim-checked result;
	// ReadPageBytes bounds a page that read_tool_result returns (each
	// tool's claim-check threshold is in its compiled policies).
	ClaimCheckPreviewBytes, ReadPageBytes int
	// MaxHedgeRatio caps hedged attempts at this fraction of the calls of
	// hedging tools.
	MaxHedgeRatio float64
}

// RunBudget bounds one drive of a run; a zero field does not bound.
type RunBudget struct {
	MaxCalls       int
	MaxToolTime    time.Duration
	MaxResultBytes int64
	// Stop ends the drive after the batch in which a call was refused,
	// instead of asking for another turn (on_budget: stop).
	Stop bool
}

// bounded reports whether the run budget bounds anything.
func (b RunBudget) bounded() bool { return b.MaxCalls > 0 || b.MaxToolTime > 0 || b.MaxResultBytes > 0 }
