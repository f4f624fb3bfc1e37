package server

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/projectdavid/toolsidecar/executor"
)

// FuzzDriveBody: any body sent to the drive API is decoded strictly or
// answered 400 or 413, never a panic; a decoded body is one JSON object.
func FuzzDriveBody(f *testing.F) {
	f.Add([]byte(`{"thread_id": "t", "assistant_id": "a", "message_id": "m", "model": "vllm/x"}`))
	f.Add([]byte(`{"thread_id": "t"} {"x": 1}`))
	f.Add([]byte(`{"max_turns": 40, "meta_data": {"a": [1, 2, {"b": null}]}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v1/runs/run_1/drive", bytes.NewReader(body))
		r.Body = http.MaxBytesReader(rec, r.Body, 4096)
		var req executor.Request
		if decodeStrict(rec, r, &req) {
			if rec.Code != http.StatusOK {
				t.Fatalf("decoded but answered %d", rec.Code)
			}
			return
		}
		if rec.Code != http.StatusBadRequest && rec.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("refused with %d", rec.Code)
		}
	})
}
