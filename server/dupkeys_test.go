package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
)

// TestDuplicateKeysRefused: on each family of state-changing routes whose
// body the sidecar reads, a body in which an object gives a key twice is
// answered 400 naming the key, in the family's error shape, and nothing
// is driven: the drive API and Core's /v1/completions in proxy mode (the
// sidecar's {"error": "..."}, at any depth), /mcp (the same shape), and
// the model APIs ({"error": {"message", "type"}}; top-level keys, as the
// body goes on to the model). Before, encoding/json kept the last key.
func TestDuplicateKeysRefused(t *testing.T) {
	ctx := context.Background()
	spec := loadSpec(t)
	// refused posts body to path (pattern in server/openapi.json).
	refused := func(t *testing.T, sc *sidecar, pattern, path, body, key string, header ...string) {
		t.Helper()
		resp := sc.do(t, ctx, "POST", path, body, header...)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var shape struct{ Error json.RawMessage }
		if resp.StatusCode != 400 || json.Unmarshal(raw, &shape) != nil || !strings.Contains(string(shape.Error), `\"`+key+`\" twice`) {
			t.Errorf("POST %s %s: %d %s; want 400 naming %q", path, body, resp.StatusCode, raw, key)
		}
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		spec.check(t, "POST", pattern, resp)
	}
	t.Run("core", func(t *testing.T) {
		sc := newSidecar(t, threeCalls(), "", standardTools()...)
		r := sc.env.NewRun()
		const drive = "/v1/runs/{run_id}/drive"
		path := "/v1/runs/" + r.RunID + "/drive"
		refused(t, sc, drive, path, strings.Replace(sc.driveBody(r), "{", `{"thread_id": "thread_of_another", `, 1), "thread_id")
		refused(t, sc, drive, path, strings.Replace(sc.driveBody(r), "{", `{"meta_data": {"tier": "free", "tier": "gold"}, `, 1), "tier")
		refused(t, sc, "/v1/completions", "/v1/completions", strings.Replace(completionBody(r), "{", `{"run_id": "run_of_another", `, 1), "run_id")
		if acts := sc.env.Sim.Actions(r.RunID); len(acts) != 0 {
			t.Errorf("the run was driven: %d actions", len(acts))
		}
	})
	t.Run("model API and MCP", func(t *testing.T) {
		sc, body := modelSidecar(t, openaisim.New(openaisim.Config{}), config.UpstreamOpenAI, "/v1", "")
		refused(t, sc, "/v1/chat/completions", "/v1/chat/completions", body(`, "model": "another"`), "model")
		resp := sc.do(t, ctx, "POST", "/v1/chat/completions", body(`, "model": "another"`))
		var shape struct {
			Error struct{ Message, Type string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&shape)
		resp.Body.Close()
		if shape.Error.Type != "invalid_request_error" || !strings.Contains(shape.Error.Message, `"model"`) {
			t.Errorf("the model API's refusal: %+v, want OpenAI's error shape", shape)
		}
		refused(t, sc, "/mcp", "/mcp", `{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "method": "tools/call", "params": {"name": "echo"}}`, "method",
			"Accept", "application/json, text/event-stream")
	})
}
