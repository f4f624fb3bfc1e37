package config

import (
	"maps"
	"slices"
	"time"
)

// Missing-tool policies.
const (
	MissingToolError   = "error"
	MissingToolFailRun = "fail_run"
)

// Executor tunes the continuation loop.
type Executor struct {
	// MaxTurns bounds completions requests per drive. default: 10
	MaxTurns int `koanf:"max_turns"`
	// MaxParallel bounds calls in flight per batch. default: 16
	MaxParallel int `koanf:"max_parallel"`
	// MissingTool: error (an error outcome listing the tools) or fail_run.
	// default: error
	MissingTool string `koanf:"missing_tool"`
	// MaxArgsBytes bounds a manifest's arguments. default: 256 KiB
	MaxArgsBytes int `koanf:"max_args_bytes"`
	// MaxResultBytes bounds a tool's result. default: 1 MiB
	MaxResultBytes int `koanf:"max_result_bytes"`
	// MaxErrorBytes bounds the error text of a failed call that the model
	// reads. default: 1 KiB
	MaxErrorBytes int `koanf:"max_error_bytes"`
	// MaxExecProcesses bounds the exec-route processes running at once,
	// across all runs. default: 64
	MaxExecProcesses int `koanf:"max_exec_processes"`
	// CancelPoll is how often Core is asked whether a run was cancelled
	// while its batch runs. default: 500ms
	CancelPoll time.Duration `koanf:"cancel_poll"`
	// CancelPollRPS bounds those requests, for all runs together, per
	// second: one listing of a caller's newest runs (up to 100) where two
	// or more of its runs wait, else one read per run. With more runs
	// waiting than it covers, each is read less often than cancel_poll. A
	// cancel sent through the sidecar (proxy mode) is seen at once,
	// without reads. default: 25
	CancelPollRPS float64 `koanf:"cancel_poll_rps"`
	// SubmitBudget bounds how long one outcome's writes to Core (its tool
	// message, its Action's status) are retried through Core faults before
	// the drive ends interrupted, keeping the outcome for the next drive.
	// default: 2m
	SubmitBudget time.Duration `koanf:"submit_budget"`
	// Lanes sets the policy of each lane a tool names (tools[].lane). A
	// lane no entry names has on_error: continue. default: none
	Lanes map[string]Lane `koanf:"lanes"`
	// RunBudget bounds what one drive of a run may spend on tools.
	// default: no bound
	RunBudget RunBudget `koanf:"run_budget"`
	// ClaimCheckBytes: a successful result larger than this is stored by
	// reference (a JetStream object store in durable mode, else memory);
	// the model gets a preview, the size and a handle, and reads further
	// pages with the built-in tool read_tool_result. default: 0 (off)
	ClaimCheckBytes int `koanf:"claim_check_bytes"`
	// ClaimCheckPreviewBytes is the size of the preview. default: 1 KiB
	ClaimCheckPreviewBytes int `koanf:"claim_check_preview_bytes"`
	// MaxHedgeRatio caps hedged requests (tools[].hedge_after) at this
	// fraction of the calls of hedging tools, across all runs, so that a
	// slow pool is not doubled in load. default: 0.1
	MaxHedgeRatio float64 `koanf:"max_hedge_ratio"`
}

// RunBudget bounds one drive of a run. Zero fields do not bound. A call
// past a budget is not dispatched: its outcome is a budget_exceeded error
// telling the model which budget and what is left.
type RunBudget struct {
	// MaxCalls bounds the tool calls of the drive.
	MaxCalls int `koanf:"max_calls"`
	// MaxToolTime bounds the time the drive's calls take, summed.
	MaxToolTime time.Duration `koanf:"max_tool_time"`
	// MaxResultBytes bounds the bytes the drive's calls return, summed.
	MaxResultBytes int64 `koanf:"max_result_bytes"`
	// OnBudget: continue (the model reads the budget_exceeded outcomes and
	// the run goes on) or stop (once a call was refused, the drive ends
	// after its batch, with status budget_exceeded, instead of asking for
	// another turn). The tools' own budgets obey it too. default: continue
	OnBudget string `koanf:"on_budget"`
}

// Budget policies.
const (
	OnBudgetContinue = "continue"
	OnBudgetStop     = "stop"
)

// Lane is the policy of an ordered lane.
type Lane struct {
	// OnError: continue (a failed call does not stop the next) or
	// skip_rest (the calls after a failed one get an error outcome saying
	// why, and do not run). default: continue
	OnError string `koanf:"on_error"`
}

// Lane error policies.
const (
	LaneContinue = "continue"
	LaneSkipRest = "skip_rest"
)

// validate checks the executor's keys; tools are those of the file, whose
// lanes executor.lanes configures.
func (e Executor) validate(tools []Tool) []error {
	p := problems{prefix: "executor"}
	p.positive(map[string]int64{"cancel_poll": int64(e.CancelPoll), "submit_budget": int64(e.SubmitBudget)}, durationText)
	p.positive(map[string]int64{"max_args_bytes": int64(e.MaxArgsBytes), "max_result_bytes": int64(e.MaxResultBytes),
		"max_error_bytes": int64(e.MaxErrorBytes), "max_exec_processes": int64(e.MaxExecProcesses)}, numberText)
	if e.MaxTurns < 1 {
		p.add("max_turns", "must be at least 1, got %d", e.MaxTurns)
	}
	if e.MaxParallel < 1 {
		p.add("max_parallel", "must be at least 1, got %d", e.MaxParallel)
	}
	if e.MissingTool != MissingToolError && e.MissingTool != MissingToolFailRun {
		p.add("missing_tool", "must be error or fail_run, got %q", e.MissingTool)
	}
	switch cc := e.ClaimCheckBytes; {
	case cc == 0:
	case cc < 0 || cc >= e.MaxResultBytes:
		p.add("claim_check_bytes", "must be between 1 and executor.max_result_bytes (%d), got %d", e.MaxResultBytes, cc)
	case e.ClaimCheckPreviewBytes < 1 || e.ClaimCheckPreviewBytes >= cc:
		p.add("claim_check_preview_bytes", "must be between 1 and claim_check_bytes (%d), got %d", cc, e.ClaimCheckPreviewBytes)
	}
	if e.CancelPollRPS < 0 {
		p.add("cancel_poll_rps", "must not be negative")
	}
	if r := e.MaxHedgeRatio; r < 0 || r > 1 {
		p.add("max_hedge_ratio", "must be between 0 and 1, got %v", r)
	}
	if b := e.RunBudget; b.MaxCalls < 0 || b.MaxToolTime < 0 || b.MaxResultBytes < 0 {
		p.add("run_budget", "limits must not be negative")
	}
	if o := e.RunBudget.OnBudget; o != "" && o != OnBudgetContinue && o != OnBudgetStop {
		p.add("run_budget.on_budget", "must be continue or stop, got %q", o)
	}
	e.validateLanes(&p, tools)
	return p.list
}

// validateLanes checks that each configured lane is named by a tool and
// has a known policy.
func (e Executor) validateLanes(p *problems, tools []Tool) {
	lanes := map[string]bool{}
	for _, t := range tools {
		lanes[t.Lane] = t.Lane != ""
	}
	for _, name := range slices.Sorted(maps.Keys(e.Lanes)) {
		key := "lanes." + name
		if !lanes[name] {
			p.add(key, "no tool names this lane%s", didYouMean(name, slices.Collect(maps.Keys(lanes))))
		}
		if o := e.Lanes[name].OnError; o != "" && o != LaneContinue && o != LaneSkipRest {
			p.add(key+".on_error", "must be continue or skip_rest, got %q", o)
		}
	}
}
