package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// ResultStore keeps results stored by claim-check, by run and handle. The
// durable ledger is one (a JetStream object store whose objects expire
// with the ledger); without it the executor keeps them in memory.
type ResultStore interface {
	PutResult(ctx context.Context, name string, data []byte) error
	// GetResult returns the stored result; ok is false when there is none.
	GetResult(ctx context.Context, name string) (data []byte, ok bool, err error)
}

// WithResultStore stores claim-checked results in rs. default: memory
func WithResultStore(rs ResultStore) Option { return func(e *Executor) { e.results = rs } }

// memResults is the result store in memory: the memo's bounded list, whose
// entries expire after memResultsTTL.
type memResults struct{ m *memMemo }

const memResultsTTL = time.Hour

func (r memResults) PutResult(ctx context.Context, name string, data []byte) error {
	if limit := r.m.entries.MaxBytes(); len(data) > limit {
		return fmt.Errorf("a result of %d bytes exceeds the memory store's %d", len(data), limit)
	}
	r.m.Remember(ctx, name, MemoEntry{Content: string(data), Expires: time.Now().Add(memResultsTTL)})
	return nil
}

func (r memResults) GetResult(ctx context.Context, name string) ([]byte, bool, error) {
	e, ok := r.m.Recall(ctx, name)
	if !ok || time.Now().After(e.Expires) {
		return nil, false, nil
	}
	return []byte(e.Content), true, nil
}

// resultName scopes a handle to its run: a model can read only the results
// of the run it is in.
func resultName(runID, handle string) string { return runID + "." + handle }

// ClaimCheck is what the model reads instead of a result too large for its
// context: a preview, the size, and the handle that read_tool_result takes.
type ClaimCheck struct {
	Handle       string `json:"handle"`
	SizeBytes    int    `json:"size_bytes"`
	Preview      string `json:"preview"`
	PreviewBytes int    `json:"preview_bytes"`
	Note         string `json:"note"`
}

// claimChecks is the claim-check policy: a successful result larger than
// the tool's claim-check threshold (executor.claim_check_bytes) and within
// the result limit is stored, and the model reads a preview and a handle
// in its place; when the store fails the result is submitted whole.
type claimChecks struct{ e *Executor }

func (p *claimChecks) concerns(in *callIn) bool {
	return in.Tool != nil && in.Tool.Policies.ClaimCheckBytes > 0
}

func (p *claimChecks) intercept(ctx context.Context, in *callIn, next step) answer {
	e := p.e
	a := next(ctx, in)
	cc := in.Tool.Policies.ClaimCheckBytes
	if a.Err != nil || len(a.Data) <= cc || len(a.Data) > e.cfg.MaxResultBytes {
		return a
	}
	data := a.Data
	handle := in.ToolCallID
	if err := e.results.PutResult(context.WithoutCancel(ctx), resultName(in.RunID, handle), data); err != nil {
		callLog(in.Log, in.ToolCall).Warn("claim-check: the result could not be stored; it is submitted whole", "bytes", len(data), "err", err)
		return a
	}
	preview := runePrefix(data, e.cfg.ClaimCheckPreviewBytes)
	a.Data, _ = json.Marshal(map[string]ClaimCheck{"claim_check": {Handle: handle, SizeBytes: len(data), Preview: string(preview), PreviewBytes: len(preview),
		Note: fmt.Sprintf("This result has %d bytes; the preview holds the first %d. Call %s with this handle, an offset and a length (at most %d) to read more.",
			len(data), len(preview), registry.ReadToolResult, e.cfg.ReadPageBytes)}})
	in.Res.ClaimCheck = handle
	return a
}

// runePrefix is at most n bytes of b, cut on a rune boundary.
func runePrefix(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return b[:n]
}

// page is read_tool_result's answer.
type page struct {
	Handle     string `json:"handle"`
	Offset     int    `json:"offset"`
	Length     int    `json:"length"`
	SizeBytes  int    `json:"size_bytes"`
	Data       string `json:"data"`
	NextOffset *int   `json:"next_offset"` // null at the end
}

// builtin answers the calls of the sidecar's own tools (route builtin).
type builtin struct{ e *Executor }

func (b builtin) Dispatch(ctx context.Context, req tool.Request) tool.Outcome {
	if req.Tool != registry.ReadToolResult {
		return tool.Outcome{Err: tool.NewError(tool.NotFound, "no built-in tool %q", req.Tool)}
	}
	call, perr := tool.ParseCall(req.Tool, req.Body)
	if perr != nil {
		return tool.Outcome{Err: tool.AsError(perr)}
	}
	var args struct {
		Handle string `json:"handle"`
		Offset int    `json:"offset"`
		Length int    `json:"length"`
	}
	if err := json.Unmarshal(call.Args, &args); err != nil {
		return tool.Outcome{Err: tool.NewError(tool.InvalidArgs, "%v", err)}
	}
	req.Sent()
	data, ok, err := b.e.results.GetResult(ctx, resultName(call.RunID, args.Handle))
	switch {
	case err != nil:
		return tool.Outcome{Err: tool.NewError(tool.WorkerCrash, "reading the stored result: %v", err)}
	case !ok:
		return tool.Outcome{Err: tool.NewError(tool.NotFound, "no stored result with handle %q in this run (they expire with the ledger)", args.Handle)}
	case args.Offset >= len(data):
		return tool.Outcome{Err: tool.NewError(tool.InvalidArgs, "offset %d is past the end: the result has %d bytes", args.Offset, len(data))}
	}
	n := args.Length
	if n <= 0 || n > b.e.cfg.ReadPageBytes {
		n = b.e.cfg.ReadPageBytes
	}
	start := args.Offset // moved on to a rune's start: a page never begins mid-character
	for start < len(data) && !utf8.RuneStart(data[start]) {
		start++
	}
	chunk := runePrefix(data[start:], n)
	p := page{Handle: args.Handle, Offset: start, Length: len(chunk), SizeBytes: len(data), Data: string(chunk)}
	if end := start + len(chunk); end < len(data) {
		p.NextOffset = &end
	}
	out, _ := json.Marshal(p)
	return tool.Outcome{Data: out}
}
