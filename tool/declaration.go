package tool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"time"
)

// Declaration is a tool as a worker declares it in its own code: what the
// sidecar would otherwise read from a tools entry of its configuration.
// Worker libraries publish it, as JSON, in their micro endpoint's metadata
// (docs/worker-protocol.md, "Declaring a tool"); the sidecar discovers it
// on $SRV.INFO.
type Declaration struct {
	Description string `json:"description,omitempty"`
	// Parameters is the arguments' JSON Schema; absent: any object.
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// SideEffects is read_only, idempotent or unsafe; absent: unsafe.
	SideEffects string `json:"side_effects,omitempty"`
	// Timeout per attempt as a Go duration ("30s"); absent: 30s.
	Timeout string `json:"timeout,omitempty"`
	// Retries after a timeout, no responders or a retryable error.
	Retries int `json:"retries,omitempty"`
}

// A tool's side effects.
const (
	// ReadOnly: the tool changes nothing; a call may be sent twice.
	ReadOnly = "read_only"
	// Idempotent: a second run of a call changes nothing more.
	Idempotent = "idempotent"
	// Unsafe: a call must never run twice.
	Unsafe = "unsafe"
)

// Bounds of a declaration: one $SRV.INFO answer carries every tool of a
// worker, and the registry compiles each schema.
const (
	MaxDeclarationBytes = 64 << 10
	MaxDescriptionBytes = 4 << 10
	MaxDeclaredRetries  = 10
	MaxDeclaredTimeout  = time.Hour
)

// toolName is what a tool may be called: the function names that Core and
// the OpenAI API take.
var toolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidName reports a name a tool may have.
func ValidName(name string) bool { return toolName.MatchString(name) }

// ParseDeclaration decodes and checks a declaration as published under a
// tool's name. Errors say what is wrong in the worker's terms.
func ParseDeclaration(name string, data []byte) (Declaration, error) {
	var d Declaration
	if !ValidName(name) {
		return d, fmt.Errorf("tool name %q: want 1 to 64 of A-Z a-z 0-9 _ -", name)
	}
	if len(data) > MaxDeclarationBytes {
		return d, fmt.Errorf("declaration of %d bytes: at most %d", len(data), MaxDeclarationBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("declaration is not the expected JSON: %w", err)
	}
	var errs []error
	if len(d.Description) > MaxDescriptionBytes {
		errs = append(errs, fmt.Errorf("description of %d bytes: at most %d", len(d.Description), MaxDescriptionBytes))
	}
	if len(d.Parameters) > 0 && (bytes.Equal(bytes.TrimSpace(d.Parameters), []byte("null")) || bytes.TrimSpace(d.Parameters)[0] != '{') {
		errs = append(errs, errors.New("parameters: want a JSON Schema object"))
	}
	if d.SideEffects != "" && !slices.Contains([]string{ReadOnly, Idempotent, Unsafe}, d.SideEffects) {
		errs = append(errs, fmt.Errorf("side_effects %q: want read_only, idempotent or unsafe", d.SideEffects))
	}
	if d.Timeout != "" {
		if t, err := time.ParseDuration(d.Timeout); err != nil || t <= 0 || t > MaxDeclaredTimeout {
			errs = append(errs, fmt.Errorf("timeout %q: want a duration above 0 and at most %s", d.Timeout, MaxDeclaredTimeout))
		}
	}
	if d.Retries < 0 || d.Retries > MaxDeclaredRetries {
		errs = append(errs, fmt.Errorf("retries %d: want 0 to %d", d.Retries, MaxDeclaredRetries))
	}
	return d, errors.Join(errs...)
}

// TimeoutOrZero is the declared timeout, 0 when absent (ParseDeclaration
// has checked it).
func (d Declaration) TimeoutOrZero() time.Duration {
	t, _ := time.ParseDuration(d.Timeout)
	return t
}

// SameJSON reports JSON documents equal as values: key order and spacing
// aside, and numbers compared as encoding/json decodes them (a schema
// read from YAML, marshalled, compares with one a worker sent). Absent
// documents are equal to each other only.
func SameJSON(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}
