package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/projectdavid/toolsidecar/tool"
)

// Spec is what a worker declares of a tool besides its handler: with it,
// the sidecar needs no tools entry for the tool (docs/tools.md).
type Spec struct {
	// Description is what the model reads of the tool.
	Description string
	// Parameters is the arguments' JSON Schema; nil: derived from the
	// handler's argument type (jsonschema.For: a struct's fields by their
	// json names, required unless omitempty, described by a jsonschema
	// tag, no other properties).
	Parameters *jsonschema.Schema
	// SideEffects is tool.ReadOnly, tool.Idempotent or tool.Unsafe;
	// "": unsafe, never sent twice.
	SideEffects string
	// Timeout per attempt; 0: the sidecar's default (30s).
	Timeout time.Duration
	// Retries after a timeout, no responders or a retryable error.
	Retries int
}

// Declare registers the handler of a tool declared in code, before Start.
// The handler takes the call's arguments decoded into A, which must
// satisfy the schema (the sidecar has checked them against it), and
// returns a result that is sent as JSON. The declaration travels in the
// tool's micro endpoint metadata, where the sidecar discovers it.
func Declare[A, R any](w *Worker, name string, spec Spec, fn func(ctx context.Context, call *tool.Call, args A) (R, error)) error {
	params := spec.Parameters
	if params == nil {
		var err error
		if params, err = jsonschema.For[A](nil); err != nil {
			return fmt.Errorf("worker: tool %s: %w", name, err)
		}
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return fmt.Errorf("worker: tool %s: parameters: %w", name, err)
	}
	d := tool.Declaration{Description: spec.Description, Parameters: raw, SideEffects: spec.SideEffects, Retries: spec.Retries}
	if spec.Timeout > 0 {
		d.Timeout = spec.Timeout.String()
	}
	return w.HandleDeclared(name, d, func(ctx context.Context, call *tool.Call) ([]byte, error) {
		var args A
		if err := json.Unmarshal(call.Args, &args); err != nil {
			return nil, tool.NewError(tool.InvalidArgs, "arguments: %v", err)
		}
		res, err := fn(ctx, call, args)
		if err != nil {
			return nil, err
		}
		return json.Marshal(res)
	})
}

// HandleDeclared registers, before Start, the handler of a tool declared
// as d, for a handler that reads the call's arguments itself (one that
// bridges to another system, or whose schema is built at run time). The
// declaration travels as Declare's does.
func (w *Worker) HandleDeclared(name string, d tool.Declaration, h tool.Handler) error {
	decl, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("worker: tool %s: %w", name, err)
	}
	// Checked as the sidecar will check it: a worker that starts declares
	// what the sidecar accepts.
	if _, err := tool.ParseDeclaration(name, decl); err != nil {
		return fmt.Errorf("worker: tool %s: %w", name, err)
	}
	w.Handle(name, h)
	w.declared[name] = string(decl)
	return nil
}
