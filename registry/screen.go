package registry

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/projectdavid/toolsidecar/tool"
)

// CheckFunction checks a tool as a model API and MCP take it: a name they
// accept, and parameters that pass the registry's check of a schema (an
// object's, its "type" said, bounded). The registry compiles no tool that
// fails it; a consumer checks again so that a tool that reached it some
// other way is left out, not sent.
func CheckFunction(ft tool.FunctionTool) error {
	if !tool.ValidName(ft.Function.Name) {
		return fmt.Errorf("name %s: want 1 to 64 of A-Z a-z 0-9 _ -", tool.Excerpt(ft.Function.Name))
	}
	var params map[string]any
	if err := json.Unmarshal(ft.Function.Parameters, &params); err != nil || params == nil {
		return errors.New("parameters: not a JSON object")
	}
	switch t, ok := params["type"]; {
	case !ok:
		return errors.New(`parameters: the schema's top must say "type": "object"`)
	case t != "object":
		return fmt.Errorf("parameters: the schema's top must be of type \"object\", not %s", tool.Excerpt(fmt.Sprint(t)))
	}
	if _, err := checkSchema(params); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	return nil
}

// LeftOutMetric registers toolsidecar_tools_left_out_total with reg, for
// the sidecar's Screens: one series per consumer, never one per tool, as
// the tools' names come from the bus.
func LeftOutMetric(reg prometheus.Registerer) *prometheus.CounterVec {
	return promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Subsystem: "tools", Name: "left_out_total",
		Help: "Tools left out of a consumer's list (mcp: the MCP server's; model: the model API's) because the consumer cannot take them, each counted once while it stays as it is."},
		[]string{"consumer"})
}

// Screen keeps one consumer's list of tools (the MCP server's, the
// model's) to the tools that consumer takes. The registry checks every
// tool alike, but a consumer may refuse one for reasons of its own (the
// MCP SDK's checks of a schema's annotations), and one tool it cannot take
// must take neither the others nor the process down with it. A tool left
// out is logged and counted once while it stays left out as it is,
// however often the list is read or the registry replaced.
type Screen struct {
	consumer string
	log      *slog.Logger
	leftOut  prometheus.Counter // nil: not counted

	mu       sync.Mutex
	reported map[string][32]byte // the tools the last pass left out: name → digest
	reg      *Registry           // the registry FunctionTools screened last
	offered  []tool.FunctionTool // and its tools that passed
}

// NewScreen screens the tools of consumer (a metric label: "mcp",
// "model"), counting in leftOut (from LeftOutMetric; nil: not counted).
// A nil log discards.
func NewScreen(consumer string, leftOut *prometheus.CounterVec, log *slog.Logger) *Screen {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Screen{consumer: consumer, log: log}
	if leftOut != nil {
		s.leftOut = leftOut.WithLabelValues(consumer)
	}
	return s
}

// Keep calls take with each of tools, in order, and returns those it
// took. The others are left out, each logged and counted the first time
// it is left out as it is now. Calls are serialised.
func (s *Screen) Keep(tools []*Tool, take func(*Tool) error) []*Tool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keep(tools, take)
}

func (s *Screen) keep(tools []*Tool, take func(*Tool) error) []*Tool {
	kept := make([]*Tool, 0, len(tools))
	reported := map[string][32]byte{}
	for _, t := range tools {
		err := take(t)
		if err == nil {
			kept = append(kept, t)
			continue
		}
		sum := digest(t)
		reported[t.Name] = sum
		if prev, ok := s.reported[t.Name]; ok && prev == sum {
			continue // reported already, and unchanged since
		}
		s.log.Error("a tool is left out", "consumer", s.consumer, "tool", t.Name, "source", t.Source, "declared_by", t.DeclaredBy, "err", err)
		if s.leftOut != nil {
			s.leftOut.Inc()
		}
	}
	s.reported = reported
	return kept
}

// FunctionTools renders reg's tools that pass CheckFunction as a tools
// array (the model's). Each registry is screened once, however many
// requests read its list.
func (s *Screen) FunctionTools(reg *Registry) []tool.FunctionTool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reg != s.reg {
		kept := s.keep(reg.Tools(), func(t *Tool) error { return CheckFunction(t.FunctionTool()) })
		s.offered = make([]tool.FunctionTool, len(kept))
		for i, t := range kept {
			s.offered[i] = t.FunctionTool()
		}
		s.reg = reg
	}
	return slices.Clone(s.offered)
}

// digest identifies a tool as a consumer sees it: a tool redeclared
// otherwise is reported again.
func digest(t *Tool) [32]byte {
	h := sha256.New()
	for _, part := range []string{t.Name, t.Description, string(t.Parameters), t.SideEffects} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}
