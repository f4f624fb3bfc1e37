// Package dupkey finds a key that a JSON object gives twice. encoding/json
// keeps the last of them, where other parsers keep the first or refuse
// the document: a request whose duplicate keys the sidecar reads one way
// may be read another way by Core, a model API, a worker or a log reader
// ({"decision": "deny", "decision": "approve"} reads as a denial to a
// person and approved the call). The sidecar refuses such a request
// instead of choosing.
package dupkey

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Error is the first key an object gives twice.
type Error struct {
	// Path is a JSON Pointer to the object ("" for the top-level one).
	Path string
	Key  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("the body gives the key %q twice", e.Key)
	}
	return fmt.Sprintf("the body gives the key %q twice, in the object at %s", e.Key, e.Path)
}

// Find returns the first key that an object of data gives twice, in the
// objects down to depth levels (1: the top-level object's own keys only;
// 0: every level), or nil. A document that is not JSON is no concern of
// Find's: it returns what it found before the syntax error, and the
// decoder the caller uses says what is wrong. data is bounded by the
// caller (the server's body limit); nesting, by encoding/json's own limit.
func Find(data []byte, depth int) *Error {
	w := walker{dec: json.NewDecoder(bytes.NewReader(data)), depth: depth}
	w.dec.UseNumber() // a number is skipped, not parsed
	tok, err := w.dec.Token()
	if err != nil {
		return nil
	}
	var de *Error
	if errors.As(w.walk(tok), &de) {
		return de
	}
	return nil
}

// walker walks a document with a decoder's tokens, keeping the path of
// the value it is in.
type walker struct {
	dec   *json.Decoder
	depth int
	path  []step
	skip  json.RawMessage // the values skipped, one after another
}

// step is one step of a path: an object's key or an array's index.
type step struct {
	key   string
	index int // -1: a key
}

// walk reads the rest of the value that begins with tok.
func (w *walker) walk(tok json.Token) error {
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar: read whole
	}
	if d == '{' {
		var seen map[string]struct{} // made for objects with keys only
		for w.dec.More() {
			kt, err := w.dec.Token()
			if err != nil {
				return err
			}
			key, _ := kt.(string)
			if _, dup := seen[key]; dup {
				return &Error{Path: w.pointer(), Key: key}
			}
			if seen == nil {
				seen = map[string]struct{}{}
			}
			seen[key] = struct{}{}
			if err := w.child(step{key: key, index: -1}); err != nil {
				return err
			}
		}
	} else {
		for i := 0; w.dec.More(); i++ {
			if err := w.child(step{index: i}); err != nil {
				return err
			}
		}
	}
	_, err := w.dec.Token() // the closing delimiter
	return err
}

// child reads the value at s, within the current one: walked when it is
// within depth, else skipped whole (Decode scans it without a token each).
func (w *walker) child(s step) error {
	if w.depth > 0 && len(w.path)+1 >= w.depth {
		w.skip = w.skip[:0]
		return w.dec.Decode(&w.skip)
	}
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	w.path = append(w.path, s)
	err = w.walk(tok)
	w.path = w.path[:len(w.path)-1]
	return err
}

// pointer renders the path as a JSON Pointer (RFC 6901).
func (w *walker) pointer() string {
	var b strings.Builder
	for _, s := range w.path {
		b.WriteByte('/')
		if s.index >= 0 {
			b.WriteString(strconv.Itoa(s.index))
			continue
		}
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(s.key))
	}
	return b.String()
}
