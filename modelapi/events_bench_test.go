package modelapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
)

// eventsCase is an API with its simulator's answer to "hello": a turn
// without tool calls, as the upstream streams it.
type eventsCase struct {
	name    string
	codec   Codec
	sim     http.Handler
	path    string
	request string
}

func eventsCases() []eventsCase {
	return []eventsCase{
		{"chat", chatCodec{}, openaisim.New(openaisim.Config{}), "/v1/chat/completions",
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`},
		{"messages", messagesCodec{}, anthropicsim.New(anthropicsim.Config{}), "/v1/messages",
			`{"model":"m","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hello"}]}`},
		{"responses", responsesCodec{}, responsesim.New(responsesim.Config{}), "/v1/responses",
			`{"model":"m","stream":true,"store":false,"input":"hello"}`},
	}
}

// events are the simulator's events for the case's request.
func (c eventsCase) events(b *testing.B) []sse.Event {
	srv := httptest.NewServer(c.sim)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+c.path, strings.NewReader(c.request))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("X-Api-Key", "k")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var evs []sse.Event
	for ev, err := range sse.Read(resp.Body, nil) {
		if err != nil {
			b.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// BenchmarkParseTurn is the sidecar's reading of one upstream turn
// without tool calls: each event of the simulator's stream through the
// API's parser, which must find the turn's end.
//
//	go test ./modelapi -run '^$' -bench 'ParseTurn|AnswerStream' -benchmem
func BenchmarkParseTurn(b *testing.B) {
	for _, c := range eventsCases() {
		b.Run("api="+c.name, func(b *testing.B) {
			evs := c.events(b)
			for b.Loop() {
				p, ended := c.codec.NewParser(), false
				for _, ev := range evs {
					pc, err := p.Take(ev)
					if err != nil {
						b.Fatal(err)
					}
					ended = ended || pc.Finish != "" || pc.Done
				}
				if !ended {
					b.Fatalf("%d events without the turn's end", len(evs))
				}
			}
		})
	}
}

// BenchmarkAnswerStream is the sidecar's writing of the application's
// stream for the same turn: the head, two text deltas, the end.
func BenchmarkAnswerStream(b *testing.B) {
	for _, c := range eventsCases() {
		b.Run("api="+c.name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodPost, c.path, nil)
			for b.Loop() {
				w := httptest.NewRecorder()
				out := c.codec.API().NewAnswer(w, r, Head{ID: c.codec.RunPrefix() + "abcdefabcdefabcdefabcdef", Model: "m"})
				out.Begin()
				out.Content("echo: he")
				out.Content("llo")
				out.Finish(Result{FinishReason: "stop", Usage: Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}}, executor.Summary{})
				if body, _ := io.ReadAll(w.Body); !strings.Contains(string(body), "llo") {
					b.Fatalf("the answer lacks its text:\n%s", body)
				}
			}
		})
	}
}
