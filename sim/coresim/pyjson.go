package coresim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"unicode/utf16"
)

// Core frames chunks with Python's json.dumps defaults: ", " and ": "
// separators and ensure_ascii escaping. This file reproduces that output so
// the simulator's bytes match the real Core's.

// field is one key of an ordered object; Python dicts keep insertion order.
type field struct {
	k string
	v any
}

// object is a JSON object whose key order is kept.
type object []field

// dumps encodes v as Python's json.dumps would. Supported values: object,
// string, bool, nil, int, json.RawMessage (re-encoded, order kept) and
// []object.
func dumps(v any) []byte {
	var b bytes.Buffer
	writeValue(&b, v)
	return b.Bytes()
}

// verbatim is written as it is: a scripted malformed value.
type verbatim string

func writeValue(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case verbatim:
		b.WriteString(string(x))
	case object:
		b.WriteByte('{')
		for i, f := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			writeString(b, f.k)
			b.WriteString(": ")
			writeValue(b, f.v)
		}
		b.WriteByte('}')
	case []object:
		b.WriteByte('[')
		for i, o := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			writeValue(b, o)
		}
		b.WriteByte(']')
	case string:
		writeString(b, x)
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int:
		b.WriteString(strconv.Itoa(x))
	case nil:
		b.WriteString("null")
	case json.RawMessage:
		if err := reformat(b, x); err != nil {
			// Not JSON: Core would have coerced it to {"raw": s}.
			writeValue(b, object{{"raw", string(x)}})
		}
	default:
		panic(fmt.Sprintf("coresim: dumps: unsupported %T", v))
	}
}

// writeString escapes like ensure_ascii=True: non-ASCII as \uXXXX
// (surrogate pairs above the BMP), and no HTML escaping.
func writeString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (r >= 0x7f && r <= 0xffff):
			fmt.Fprintf(b, `\u%04x`, r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// reformat re-encodes a JSON document in Python's style, keeping key order
// and number text.
func reformat(b *bytes.Buffer, raw []byte) error {
	if !json.Valid(raw) {
		return fmt.Errorf("coresim: invalid JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return reformatValue(b, dec)
}

func reformatValue(b *bytes.Buffer, dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		closing := map[json.Delim]byte{'{': '}', '[': ']'}[t]
		b.WriteByte(byte(t))
		for i := 0; dec.More(); i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			if t == '{' {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				writeString(b, key.(string))
				b.WriteString(": ")
			}
			if err := reformatValue(b, dec); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil && err != io.EOF {
			return err
		}
		b.WriteByte(closing)
	case string:
		writeString(b, t)
	case json.Number:
		b.WriteString(t.String())
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case nil:
		b.WriteString("null")
	}
	return nil
}
