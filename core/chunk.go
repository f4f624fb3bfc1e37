package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/projectdavid/toolsidecar/internal/frames"
)

// Kind names the type of a chunk on the completions stream.
type Kind string

// The chunk kinds Core emits on the consumer-tool path (core-protocol.md A.1).
// Any other type decodes as [KindUnknown] and keeps its raw JSON.
const (
	KindStatus    Kind = "status"
	KindContent   Kind = "content"
	KindReasoning Kind = "reasoning"
	KindPlan      Kind = "plan"
	KindDecision  Kind = "decision"
	KindToolCall  Kind = "tool_call"
	KindManifest  Kind = "tool_call_manifest"
	KindError     Kind = "error"
	KindUnknown   Kind = "unknown"
)

// Chunk is one decoded frame of the completions stream. Kind decides which
// fields are set; Raw always holds the frame's JSON exactly as Core sent it.
type Chunk struct {
	Kind Kind
	// Type is the wire "type" (or "stream_type" for envelopes) even when Kind
	// is [KindUnknown].
	Type  string
	RunID string
	// Status is set for [KindStatus]: started, processing, complete, ...
	Status string
	// Text is the text of content, reasoning, plan, decision and error
	// chunks. For errors it comes from "content", "message" or "error",
	// whichever is present (worker and router errors differ).
	Text string
	// Call is set for [KindToolCall], the informational pre-manifest chunk.
	Call *ToolCall
	// Manifest is set for [KindManifest].
	Manifest *Manifest
	Raw      json.RawMessage
}

// ToolCall is the informational tool_call chunk's content. Arguments is a
// JSON string as the model produced it, not an object.
type ToolCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Manifest is a consumer tool call handed to the client. Raw keeps the frame
// verbatim so that workers receive exactly what Core sent.
type Manifest struct {
	Type       string          `json:"type"`
	RunID      string          `json:"run_id"`
	ActionID   string          `json:"action_id"`
	ToolCallID string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Args       json.RawMessage `json:"args"`
	Raw        json.RawMessage `json:"-"`
	// Problem, when set, says why the manifest did not decode whole; the
	// IDs were still read from it, so the call can get an error outcome.
	Problem string `json:"-"`
}

// ErrFrame marks a frame that could not be decoded; the stream itself may go
// on. Use errors.As with *FrameError for the details.
var ErrFrame = errors.New("core: undecodable frame")

// FrameError describes one undecodable frame: data that is not JSON, JSON
// that is not an object, or a known type whose fields have the wrong shape.
type FrameError struct {
	Data   []byte // bounded excerpt of the frame
	Reason string
	Err    error
	// Manifest is set when the frame is a tool_call_manifest whose
	// action_id or tool_call_id could not be read: a call nobody can
	// answer, so the run cannot go on.
	Manifest bool
}

func (e *FrameError) Error() string {
	return fmt.Sprintf("core: undecodable frame (%s): %q", e.Reason, e.Data)
}

// Unwrap lets errors.Is match both ErrFrame and the underlying cause.
func (e *FrameError) Unwrap() []error { return []error{ErrFrame, e.Err} }

const frameExcerpt = 256

func frameError(data []byte, reason string, err error) *FrameError {
	if len(data) > frameExcerpt {
		data = data[:frameExcerpt]
	}
	return &FrameError{Data: bytes.Clone(data), Reason: reason, Err: err}
}

// wireChunk is the union of the fields any chunk type carries.
type wireChunk struct {
	Type       string          `json:"type"`
	StreamType string          `json:"stream_type"`
	RunID      string          `json:"run_id"`
	Status     string          `json:"status"`
	Content    json.RawMessage `json:"content"`
	Message    json.RawMessage `json:"message"`
	Error      json.RawMessage `json:"error"`
	ActionID   string          `json:"action_id"`
	ToolCallID string          `json:"tool_call_id"`
	Tool       string          `json:"tool"`
	Args       json.RawMessage `json:"args"`
}

// MaxDepth bounds the nesting of a frame (the model's arguments are part
// of it). A manifest nested deeper is not decoded: its call gets an
// invalid-arguments outcome.
const MaxDepth = 64

// DecodeChunk decodes the data of one SSE frame. It never panics: every
// input yields a chunk or a *FrameError. A tool_call_manifest that does not
// decode whole still yields a manifest chunk, with Manifest.Problem set,
// when its action_id and tool_call_id can be read.
func DecodeChunk(data []byte) (Chunk, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return Chunk{}, frameError(data, "not JSON", nil)
		}
		return Chunk{}, frameError(data, "JSON is not an object", nil)
	}
	if d := depth(trimmed); d > MaxDepth {
		return salvage(data, trimmed, fmt.Sprintf("nested %d levels deep, more than the limit of %d", d, MaxDepth), nil)
	}
	var w wireChunk
	if err := json.Unmarshal(trimmed, &w); err != nil {
		if !json.Valid(trimmed) {
			return salvage(data, trimmed, "not JSON", err)
		}
		return salvage(data, trimmed, "field of the wrong type", err)
	}
	c := Chunk{Type: w.Type, RunID: w.RunID, Raw: json.RawMessage(bytes.Clone(trimmed))}
	if c.Type == "" {
		c.Type = w.StreamType
	}
	switch Kind(w.Type) {
	case KindStatus:
		c.Kind, c.Status = KindStatus, w.Status
	case KindContent, KindReasoning, KindPlan, KindDecision:
		text, err := textField(w.Content)
		if err != nil {
			return Chunk{}, frameError(data, w.Type+" content is not a string", err)
		}
		c.Kind, c.Text = Kind(w.Type), text
	case KindError:
		c.Kind = KindError
		for _, f := range []json.RawMessage{w.Content, w.Message, w.Error} {
			if text, err := textField(f); err == nil && text != "" {
				c.Text = text
				break
			} else if err != nil {
				c.Text = string(f) // a structured error keeps its JSON
				break
			}
		}
	case KindToolCall:
		var tc ToolCall
		if err := json.Unmarshal(w.Content, &tc); err != nil || len(w.Content) == 0 {
			return Chunk{}, frameError(data, "tool_call content is not {name, arguments}", err)
		}
		c.Kind, c.Call = KindToolCall, &tc
	case KindManifest:
		if w.ActionID == "" || w.ToolCallID == "" {
			fe := frameError(data, "manifest without action_id or tool_call_id", nil)
			fe.Manifest = true
			return Chunk{}, fe
		}
		if w.Tool == "" {
			c.Kind = KindManifest
			c.Manifest = &Manifest{Type: w.Type, RunID: w.RunID, ActionID: w.ActionID, ToolCallID: w.ToolCallID,
				Args: w.Args, Raw: c.Raw, Problem: "the manifest names no tool"}
			return c, nil
		}
		c.Kind = KindManifest
		c.Manifest = &Manifest{
			Type: w.Type, RunID: w.RunID, ActionID: w.ActionID, ToolCallID: w.ToolCallID,
			Tool: w.Tool, Args: w.Args, Raw: c.Raw,
		}
	default:
		c.Kind = KindUnknown
	}
	return c, nil
}

// salvage handles a frame that did not decode: a tool_call_manifest whose
// IDs can be read becomes a manifest chunk with a Problem; any other frame
// is a *FrameError (marked Manifest when it was a manifest).
func salvage(data, trimmed []byte, reason string, err error) (Chunk, error) {
	f := topLevelStrings(trimmed)
	fe := frameError(data, reason, err)
	if f["type"] != string(KindManifest) {
		return Chunk{}, fe
	}
	if f["action_id"] == "" || f["tool_call_id"] == "" {
		fe.Manifest = true
		return Chunk{}, fe
	}
	problem := "the manifest is malformed (" + reason + ")"
	if err != nil {
		problem += ": " + err.Error()
	}
	m := &Manifest{Type: f["type"], RunID: f["run_id"], ActionID: f["action_id"], ToolCallID: f["tool_call_id"],
		Tool: f["tool"], Raw: json.RawMessage(bytes.Clone(trimmed)), Problem: problem}
	return Chunk{Kind: KindManifest, Type: m.Type, RunID: m.RunID, Manifest: m, Raw: m.Raw}, nil
}

// decodeOversized handles the head of a frame longer than limit: a
// manifest whose ids it holds (Core writes them before the arguments) is a
// call whose Problem says why it cannot run; any other frame is a
// *FrameError, marked Manifest when a manifest's ids could not be read.
func decodeOversized(head []byte, size string, limit int) (Chunk, error) {
	reason := fmt.Sprintf("a frame of %s bytes, over the limit of %d", size, limit)
	trimmed := bytes.TrimSpace(head)
	f := topLevelStrings(trimmed)
	fe := frameError(head, reason, nil)
	if f["type"] != string(KindManifest) {
		return Chunk{}, fe
	}
	if f["action_id"] == "" || f["tool_call_id"] == "" {
		fe.Manifest = true
		return Chunk{}, fe
	}
	m := &Manifest{Type: f["type"], RunID: f["run_id"], ActionID: f["action_id"], ToolCallID: f["tool_call_id"], Tool: f["tool"],
		Problem: fmt.Sprintf("the manifest is %s bytes long, over the limit of %d; its arguments were not read", size, limit)}
	m.Raw = json.RawMessage("{}")
	return Chunk{Kind: KindManifest, Type: m.Type, RunID: m.RunID, Manifest: m, Raw: m.Raw}, nil
}

// topLevelStrings reads the string members of a JSON object, as far as the
// text allows, without decoding nested values (which may be broken, too
// deep, or cut).
func topLevelStrings(data []byte) map[string]string {
	out := map[string]string{}
	for k, v := range frames.TopLevel(data) {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
		}
	}
	return out
}

// depth is the deepest nesting of brackets in a JSON text, strings skipped.
func depth(data []byte) int {
	d, deepest, inString := 0, 0, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case inString:
			if c == '\\' {
				i++
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			d++
			deepest = max(deepest, d)
		case c == '}' || c == ']':
			d--
		}
	}
	return deepest
}

// textField reads a JSON string field; an absent or null field is "".
func textField(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}
