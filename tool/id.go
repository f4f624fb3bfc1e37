package tool

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Bounds of the ids that enter the sidecar from callers, upstreams, workers
// and MCP servers. They are checked where an id enters, so that nothing a
// caller or a model wrote reaches a NATS subject, a KV key, a URL path or a
// log line unchecked.
//
// Core's own ids are a prefix and an underscore before 22 alphanumerics
// (act_…, run_…, core-protocol.md), 26 characters in all; the sidecar's are
// shorter still. 128 leaves room for a fivefold longer scheme.
//
// A tool_call_id is written by the model, or by the server that runs it:
// call_ and 24 alphanumerics (OpenAI), toolu_… (Anthropic), chatcmpl-tool-
// and 32 hex digits (vLLM), nine alphanumerics (Mistral), functions.name:0
// (Kimi), or whatever the model put in its JSON (Core's parser). It never
// becomes a subject or a key; it is echoed to the upstream and the
// application, so it keeps their characters and a bound of 256.
const (
	MaxIDBytes     = 128
	MaxCallIDBytes = 256
)

// CheckID reports whether id may name a run, a thread, an assistant, a
// message or an Action: 1 to [MaxIDBytes] letters, digits, '_' or '-', the
// characters that are safe as one NATS subject token, a KV key, a URL path
// segment and a log field. what names the id in the error.
func CheckID(what, id string) error {
	if len(id) == 0 || len(id) > MaxIDBytes {
		return fmt.Errorf("%s must be 1 to %d characters, not %d: %s", what, MaxIDBytes, len(id), Excerpt(id))
	}
	for i := 0; i < len(id); i++ {
		if !idByte(id[i]) {
			return fmt.Errorf("%s may hold only letters, digits, '_' and '-': %s", what, Excerpt(id))
		}
	}
	return nil
}

// CheckCallID reports whether id may be a tool_call_id: 1 to
// [MaxCallIDBytes] letters, digits or any of "_-.:=+/".
func CheckCallID(id string) error {
	if len(id) == 0 || len(id) > MaxCallIDBytes {
		return fmt.Errorf("tool_call_id must be 1 to %d characters, not %d: %s", MaxCallIDBytes, len(id), Excerpt(id))
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case idByte(c), c == '.', c == ':', c == '=', c == '+', c == '/':
		default:
			return fmt.Errorf("tool_call_id may hold only letters, digits and any of \"_-.:=+/\": %s", Excerpt(id))
		}
	}
	return nil
}

func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// Truncate bounds s to limit bytes, on a rune boundary, saying how much
// was cut: a worker's error text before the model reads it, an error
// message before a caller does.
func Truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d more bytes cut)", len(s)-cut)
}

// MaxErrorMessage bounds the message of an error answer of the HTTP API:
// it may quote what the caller sent (a decoder's error names the field),
// never at length.
const MaxErrorMessage = 512

// excerptBytes is how much of a rejected value an error message shows.
const excerptBytes = 32

// Excerpt is a short, quoted and escaped prefix of s, for an error message
// about s: a message never echoes more than a few dozen bytes of what was
// sent, nor a byte that a terminal or a page would interpret.
func Excerpt(s string) string {
	if len(s) <= excerptBytes {
		return strconv.QuoteToASCII(s)
	}
	cut := excerptBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.QuoteToASCII(s[:cut]), len(s))
}
