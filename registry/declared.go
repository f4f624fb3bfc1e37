package registry

import (
	"errors"
	"fmt"
	"strings"

	"github.com/projectdavid/toolsidecar/tool"
)

// Where a tool is defined (Tool.Source).
const (
	// SourceConfig: a tools entry of the configuration (or a tool it
	// imports from an MCP server).
	SourceConfig = "config"
	// SourceWorker: declared in workers' code only; it is served while a
	// worker declares it.
	SourceWorker = "worker"
	// SourceConfigAndWorker: declared in workers' code, with the
	// configuration's entry setting its policies.
	SourceConfigAndWorker = "config+worker"
	// SourceBuiltin: the sidecar's own tool.
	SourceBuiltin = "builtin"
)

// Declared is a tool as the workers on the bus declare it in their code.
type Declared struct {
	Name        string
	Declaration tool.Declaration
	// By names the workers that declare it, as messages show them.
	By []string
}

// DeclarationError is a worker's declaration of a tool that cannot be
// served: it contradicts the configuration's entry of the tool (Key), or
// does not compile.
type DeclarationError struct {
	Tool string
	Key  string // the configuration's entry, when there is one
	By   []string
	Err  error
}

func (e *DeclarationError) Error() string {
	by := strings.Join(e.By, ", ")
	if e.Key != "" {
		return fmt.Sprintf("%s (%s) in the configuration and the tool declared by %s disagree: %v", e.Key, e.Tool, by, e.Err)
	}
	return fmt.Sprintf("tool %s declared by %s: %v", e.Tool, by, e.Err)
}

func (e *DeclarationError) Unwrap() error { return e.Err }

// Is lets errors.Is match ErrInvalidTool.
func (e *DeclarationError) Is(target error) bool { return target == ErrInvalidTool }

// DeclarationErrors are the declaration errors among err's.
func DeclarationErrors(err error) []*DeclarationError {
	var out []*DeclarationError
	var walk func(error)
	walk = func(err error) {
		if de, ok := err.(*DeclarationError); ok {
			out = append(out, de)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		} else if u := errors.Unwrap(err); u != nil {
			walk(u)
		}
	}
	walk(err)
	return out
}

// Declared lists the declarations the registry was built with.
func (r *Registry) Declared() []Declared { return r.declared }

// Conflicts are the declarations that contradict the configuration's entry
// of their tool: the entry is in force and they are left out. Start,
// discovery, reload and `toolsidecar check` all report them, and check
// fails on them.
func (r *Registry) Conflicts() []*DeclarationError { return r.conflicts }
