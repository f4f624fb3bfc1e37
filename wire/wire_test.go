package wire

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/tool"
)

// FuzzDecodeOutcome: whatever headers and body a worker (or an attacker
// on the bus) replies with, decoding yields an outcome of the taxonomy:
// never a panic, never an unknown error type.
func FuzzDecodeOutcome(f *testing.F) {
	f.Add("", "", "", []byte(`{"ok": true}`))
	f.Add("422", "tool_error", "no seats", []byte{})
	f.Add("400", "", "bad input", []byte{})
	f.Add("x", "bogus", "", []byte("body"))
	f.Add("999999999999999999999", "timeout", "\x00", []byte{0xff})
	f.Fuzz(func(t *testing.T, code, typ, desc string, body []byte) {
		m := nats.NewMsg("r")
		m.Data = body
		if code != "" {
			m.Header.Set(tool.HeaderServiceCode, code)
		}
		if typ != "" {
			m.Header.Set(tool.HeaderErrorType, typ)
		}
		if desc != "" {
			m.Header.Set(tool.HeaderServiceError, desc)
		}
		o := DecodeOutcome(m, 0)
		if !o.Sent {
			t.Fatal("a reply that arrived is Sent")
		}
		if o.Err != nil && !o.Err.Type.Known() {
			t.Fatalf("error type %q outside the taxonomy", o.Err.Type)
		}
		if (code != "" || typ != "") != (o.Err != nil) {
			t.Fatalf("code %q type %q gave %+v", code, typ, o)
		}
	})
}
