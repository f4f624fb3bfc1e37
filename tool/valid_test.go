package tool

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzValidJSON: validJSON answers as json.Valid does, on any input.
func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{
		manifest, ``, ` `, `{}`, `[]`, ` {"a" : [1, -0.5e+3, true, false, null, "x\u00e9\n"]} `,
		`{"a":1,}`, `[1,]`, `{"a"}`, `{"a":}`, `{,}`, `[01]`, `[-]`, `[1.]`, `[1e]`, `[.5]`, `[1E+]`,
		`"\u12"`, `"\x"`, "\"\x01\"", `"unterminated`, `tru`, `nul`, `{"a":1}{}`, `[1 2]`, `{"a" 1}`,
		`]`, `}`, `{]`, `[}`, "\"\xff\"", `-`, `-01`, `1.5E-07`, `"\/\b\f\r\t\\\""`,
		strings.Repeat("[", 64) + strings.Repeat("]", 64),
		strings.Repeat("[", 65) + strings.Repeat("]", 65),
		strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70),
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		strings.Repeat("[", 65) + strings.Repeat("]", 64),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := validJSON(data), json.Valid(data); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", data, got, want)
		}
	})
}

// BenchmarkValidJSON: the manifest check, against json.Valid.
//
//	go test ./tool -run '^$' -bench ValidJSON
func BenchmarkValidJSON(b *testing.B) {
	body := []byte(manifest)
	b.Run("validJSON", func(b *testing.B) {
		for b.Loop() {
			validJSON(body)
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		for b.Loop() {
			json.Valid(body)
		}
	})
}
