package config

import (
	"errors"
	"testing"
)

// FuzzParse: any bytes as a configuration file give a configuration or an
// ErrInvalid error, never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte("core: {url: http://127.0.0.1:9000}\n"))
	f.Add([]byte("tools: [{name: a, timeout: 30s, exec: {command: [ls]}}]\n"))
	f.Add([]byte("nats: {embedded: {workers: [{name: w, password_file: /p, tools: ['*']}]}}\n"))
	f.Add([]byte("core: {timeout: 30}\n"))
	f.Add([]byte("{{{{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := Parse(data); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("error %v is not ErrInvalid", err)
		}
	})
}
