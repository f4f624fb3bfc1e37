package core

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func seedFrames(f *testing.F) {
	files, _ := filepath.Glob("testdata/frames/*.sse")
	for _, file := range files {
		data, _ := os.ReadFile(file)
		f.Add(data)
	}
	f.Add([]byte(`{"type": "tool_call_manifest", "action_id": "a", "tool": "t", "args": "noise {\"a\": 1}"}`))
	f.Add([]byte(`{"type": "error", "content": {"nested": true}}`))
	f.Add([]byte(`{"type": 5}`))
	f.Add([]byte("\xff\xfe"))
}

// FuzzDecodeChunk: no input panics; every input gives a chunk or a
// *FrameError, never both and never neither.
func FuzzDecodeChunk(f *testing.F) {
	seedFrames(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeChunk(data)
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) || !errors.Is(err, ErrFrame) {
				t.Fatalf("error %v is not a *FrameError", err)
			}
			if c.Kind != "" {
				t.Fatalf("chunk %v returned with an error", c.Kind)
			}
			return
		}
		if c.Kind == "" || len(c.Raw) == 0 {
			t.Fatalf("chunk without kind or raw: %+v", c)
		}
		if c.Kind == KindManifest && (c.Manifest == nil || c.Manifest.ActionID == "") {
			t.Fatalf("manifest chunk without manifest: %+v", c)
		}
	})
}

// FuzzStream: any body ends in io.EOF, ErrTruncated or another error, and
// never panics or loops forever.
func FuzzStream(f *testing.F) {
	seedFrames(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		s := streamFrom(bytes.NewReader(body), 0)
		defer s.Close()
		for i := 0; ; i++ {
			if i > len(body)+2 {
				t.Fatalf("more results than bytes")
			}
			_, err := s.Next()
			if err == nil || errors.Is(err, ErrFrame) {
				continue
			}
			if errors.Is(err, io.EOF) || errors.Is(err, ErrTruncated) {
				return
			}
			return // a size error is a valid end too
		}
	})
}
