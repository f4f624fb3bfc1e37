package openaiup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// ownerAPI is a model API as an application reaches it with raw HTTP: its
// upstream kind and simulator, its path, and the header its key goes in.
type ownerAPI struct {
	kind, path string
	sim        http.Handler
	simPath    string
	keyed      func(h http.Header, key string)
	body       func(user string) string
}

func ownerAPIs() []ownerAPI {
	bearer := func(h http.Header, key string) { h.Set("Authorization", "Bearer "+key) }
	return []ownerAPI{
		{kind: config.UpstreamOpenAI, path: "/v1/chat/completions", sim: openaisim.New(openaisim.Config{}), simPath: "/v1", keyed: bearer,
			body: func(user string) string {
				return `{"model": "sim-model", "stream": true, "messages": [{"role": "user", "content": ` + quote(user) + `}]}`
			}},
		{kind: config.UpstreamResponses, path: "/v1/responses", sim: responsesim.New(responsesim.Config{}), simPath: "/v1", keyed: bearer,
			body: func(user string) string {
				return `{"model": "sim-model", "stream": true, "input": ` + quote(user) + `}`
			}},
		{kind: config.UpstreamAnthropic, path: "/v1/messages", sim: anthropicsim.New(anthropicsim.Config{}),
			keyed: func(h http.Header, key string) { h.Set("X-Api-Key", key); h.Set("Anthropic-Version", "2023-06-01") },
			body: func(user string) string {
				return `{"model": "sim-model", "max_tokens": 1024, "stream": true, "messages": [{"role": "user", "content": ` + quote(user) + `}]}`
			}},
	}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// TestRunBelongsToItsCaller: in each model-API mode, a run that key A
// began, live while its tool runs, is refused to key B on every way in:
// attaching through the drive API (JSON and SSE), resuming it with a
// Last-Event-ID, and the same Idempotency-Key, which names another run for
// B. Each refusal is a 403 that quotes nothing of the run. A attaches and
// reads the answer. Before, B streamed A's tool results and text.
func TestRunBelongsToItsCaller(t *testing.T) {
	for _, api := range ownerAPIs() {
		t.Run(api.kind, func(t *testing.T) {
			srv := httptest.NewServer(api.sim)
			defer srv.Close()
			release := make(chan struct{})
			var once sync.Once
			started := make(chan struct{}, 4)
			hold := testenv.Tool{Config: config.Tool{Name: "hold"}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
				started <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return []byte(`"the secret result"`), nil
			}}
			env, hc := startSidecar(t, api.kind, srv.URL+api.simPath, testenv.Options{}, hold)
			defer once.Do(func() { close(release) })
			user := script([][]map[string]any{{{"name": "hold", "arguments": map[string]any{}}}}, "the secret answer")
			ask := func(key string) *http.Response {
				req, _ := http.NewRequest("POST", env.URL+api.path, strings.NewReader(api.body(user)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "request-1")
				api.keyed(req.Header, key)
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			first := ask("key-A")
			defer first.Body.Close()
			id := first.Header.Get("X-Toolsidecar-Run-Id")
			<-started
			driveReq := func(key string, sse bool) *http.Request {
				body, _ := json.Marshal(map[string]string{"thread_id": "t1", "assistant_id": "a1", "message_id": "m1", "model": "sim-model"})
				req, _ := http.NewRequest("POST", env.URL+"/v1/runs/"+id+"/drive", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				api.keyed(req.Header, key)
				if sse {
					req.Header.Set("Accept", "text/event-stream")
				}
				return req
			}
			drive := func(key string, sse bool) (int, string) {
				req := driveReq(key, sse)
				if sse {
					req.Header.Set("Last-Event-ID", "abc-1")
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			for _, sse := range []bool{false, true} {
				code, body := drive("key-B", sse)
				if code != http.StatusForbidden || strings.Contains(body, "secret") || strings.Contains(body, "hold") || len(body) > 1024 {
					t.Errorf("another caller's drive (sse %v): %d %s, want 403 quoting nothing", sse, code, body)
				}
			}
			// The same key from another caller is another run: it neither
			// attaches to A's nor reads its answer.
			other := ask("key-B")
			if got := other.Header.Get("X-Toolsidecar-Run-Id"); got == id || got == "" {
				t.Errorf("key B's request with A's Idempotency-Key runs %q, A's run is %q", got, id)
			}
			<-started
			// The owner attaches: its SSE stream begins once the drive took
			// it. Then the tools finish, and every caller reads the end.
			attached, err := hc.Do(driveReq("key-A", true))
			if err != nil || attached.StatusCode != http.StatusOK {
				t.Fatalf("the owner's drive: %v %v", attached, err)
			}
			once.Do(func() { close(release) })
			events, _ := io.ReadAll(attached.Body)
			attached.Body.Close()
			if !strings.Contains(string(events), "event: done") || !strings.Contains(string(events), `"completed"`) {
				t.Errorf("the owner's drive: %.600s", events)
			}
			for _, resp := range []*http.Response{first, other} {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.Contains(streamText(b), "the secret answer") {
					t.Errorf("an application's answer: %.300s", b)
				}
			}
		})
	}
}

// TestApplicationLeavesWhileAnUnsafeCallRuns: in each model-API mode the
// application drops its stream while an unsafe call runs, then sends the
// same request again with its Idempotency-Key. The model is told that the
// call was interrupted (its effect is unknown), never that it was
// cancelled: who left does not change what the model reads. The tool ran
// once, and the resumed answer keeps the run's id and its created time.
// Before, the model read "cancelled" and the answer said "created": 0.
func TestApplicationLeavesWhileAnUnsafeCallRuns(t *testing.T) {
	created := regexp.MustCompile(`"created(_at)?":\s*(\d+)`)
	for _, api := range ownerAPIs() {
		t.Run(api.kind, func(t *testing.T) {
			srv := httptest.NewServer(api.sim)
			defer srv.Close()
			var runs atomic.Int32
			started, stopped := make(chan struct{}, 1), make(chan struct{}, 1)
			pay := testenv.Tool{Config: config.Tool{Name: "pay", SideEffects: config.Unsafe}, Handler: func(ctx context.Context, c *tool.Call) ([]byte, error) {
				runs.Add(1)
				started <- struct{}{}
				<-ctx.Done() // the application leaves while it runs
				stopped <- struct{}{}
				return nil, ctx.Err()
			}}
			env, hc := startSidecar(t, api.kind, srv.URL+api.simPath, testenv.Options{}, pay)
			user := script([][]map[string]any{{{"name": "pay", "arguments": map[string]any{}}}}, "the answer")
			ask := func(ctx context.Context) (*http.Response, error) {
				req, _ := http.NewRequestWithContext(ctx, "POST", env.URL+api.path, strings.NewReader(api.body(user)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "request-1")
				api.keyed(req.Header, "key-A")
				return hc.Do(req)
			}
			ctx, cancel := context.WithCancel(context.Background())
			first, err := ask(ctx)
			if err != nil {
				t.Fatal(err)
			}
			<-started
			// The Responses answer begins with response.created, before
			// any text; the others write nothing until the model's text.
			head := make([]byte, 4096)
			n := 0
			if api.kind == config.UpstreamResponses {
				n, _ = first.Body.Read(head)
			}
			cancel()
			first.Body.Close()
			<-stopped // the drive was cancelled with its last caller
			// The retry resumes the run once the sidecar has let it go.
			var resp *http.Response
			var body []byte
			poll.Until(t, "the retry to be answered whole", func() bool {
				if resp, err = ask(context.Background()); err != nil {
					return false
				}
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK && strings.Contains(string(body), "the answer")
			})
			if text := streamText(body); !strings.Contains(text, `"error_type":"interrupted"`) || strings.Contains(text, `"error_type":"cancelled"`) {
				t.Errorf("the model read: %.600s\nwant pay interrupted, never cancelled", text)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the unsafe tool ran %d times", n)
			}
			if a, b := first.Header.Get("X-Toolsidecar-Run-Id"), resp.Header.Get("X-Toolsidecar-Run-Id"); a == "" || a != b {
				t.Errorf("run ids %q and %q", a, b)
			}
			// Messages has no created time; Chat Completions showed none
			// before the drop.
			m1, m2 := created.FindSubmatch(head[:n]), created.FindSubmatch(body)
			switch {
			case api.kind == config.UpstreamAnthropic:
			case m2 == nil || string(m2[2]) == "0":
				t.Errorf("the resumed answer's created is %q", m2)
			case api.kind == config.UpstreamResponses && (m1 == nil || string(m1[2]) != string(m2[2])):
				t.Errorf("created %q, then %q in the resumed answer", m1, m2)
			}
		})
	}
}

// streamText is the text of a streamed answer of any of the three APIs:
// Chat Completions' content deltas, Responses' output_text deltas,
// Messages' text deltas, in order.
func streamText(body []byte) string {
	var out strings.Builder
	for line := range strings.Lines(string(body)) {
		data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type    string          `json:"type"`
			Delta   json.RawMessage `json:"delta"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		for _, c := range ev.Choices {
			out.WriteString(c.Delta.Content)
		}
		var text string
		var block struct {
			Text string `json:"text"`
		}
		switch {
		case ev.Type == "response.output_text.delta" && json.Unmarshal(ev.Delta, &text) == nil:
			out.WriteString(text)
		case ev.Type == "content_block_delta" && json.Unmarshal(ev.Delta, &block) == nil:
			out.WriteString(block.Text)
		}
	}
	return out.String()
}

// TestLiveViewShowsACallerItsOwnRuns: in each model-API mode, key A's run
// and key B's, each with a tool call, are on the board; each caller's
// GET /v1/sidecar/runs and /ui/events list its own run only, and B reads
// 404 for A's run as for one the board does not keep; a request with no
// credential lists nothing; the operator's token lists both. Before,
// every request listed both and B read A's calls and result previews.
func TestLiveViewShowsACallerItsOwnRuns(t *testing.T) {
	const operator = "operator-token-7f3e"
	for _, api := range ownerAPIs() {
		t.Run(api.kind, func(t *testing.T) {
			srv := httptest.NewServer(api.sim)
			defer srv.Close()
			env, hc := startSidecar(t, api.kind, srv.URL+api.simPath, testenv.Options{Operator: operator})
			user := script(echoCalls(1), "the answer")
			as := func(key string) http.Header {
				h := http.Header{}
				if key != "" {
					api.keyed(h, key)
				}
				return h
			}
			ids := map[string]string{}
			for _, key := range []string{"key-A", "key-B"} {
				req, _ := http.NewRequest("POST", env.URL+api.path, strings.NewReader(api.body(user)))
				req.Header = as(key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if ids[key] = resp.Header.Get("X-Toolsidecar-Run-Id"); resp.StatusCode != http.StatusOK || ids[key] == "" {
					t.Fatalf("%s's request: %d %.300s", key, resp.StatusCode, body)
				}
			}
			a, b := ids["key-A"], ids["key-B"]
			both := []string{a, b}
			slices.Sort(both)
			opHeader := http.Header{"Authorization": {"Bearer " + operator}}
			poll.Until(t, "both runs to end on the board", func() bool {
				var run struct{ Status string }
				return testenv.BoardGet(t, env.URL+"/v1/sidecar/runs/"+a, opHeader, &run) == http.StatusOK && run.Status == "completed" &&
					testenv.BoardGet(t, env.URL+"/v1/sidecar/runs/"+b, opHeader, &run) == http.StatusOK && run.Status == "completed"
			})
			for _, c := range []struct {
				who    string
				header http.Header
				want   []string
			}{{"key A", as("key-A"), []string{a}}, {"key B", as("key-B"), []string{b}}, {"no credential", as(""), nil}, {"the operator", opHeader, both}} {
				listed, streamed := testenv.Board(t, env.URL, c.header)
				if !slices.Equal(listed, c.want) || !slices.Equal(streamed, c.want) {
					t.Errorf("%s: GET /v1/sidecar/runs lists %v, /ui/events %v; want %v", c.who, listed, streamed, c.want)
				}
			}
			for _, c := range []struct {
				who    string
				header http.Header
				want   int
			}{{"key B", as("key-B"), http.StatusNotFound}, {"no credential", as(""), http.StatusNotFound}, {"key A", as("key-A"), http.StatusOK}} {
				if got := testenv.BoardGet(t, env.URL+"/v1/sidecar/runs/"+a, c.header, nil); got != c.want {
					t.Errorf("%s reading A's run: %d, want %d", c.who, got, c.want)
				}
			}
		})
	}
}
