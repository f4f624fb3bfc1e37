package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
)

// tripReply is the demo's model on a model API: the first turn of
// Scenario (its text and its six calls), then, once results came, an
// answer quoting each in order.
func tripReply(results []string) openaisim.Reply {
	if len(results) > 0 {
		return openaisim.Reply{Content: "Here is what I found:\n- " + strings.Join(results, "\n- ")}
	}
	first := Scenario().Turns[0]
	r := openaisim.Reply{Content: first.Content}
	for _, c := range first.Calls {
		r.Calls = append(r.Calls, openaisim.Call{Name: c.Tool, Args: c.ArgsJSON})
	}
	return r
}

// tripModel plays the model of the OpenAI-compatible upstream.
func tripModel(req openaisim.Request) openaisim.Reply { return tripReply(toolResults(req.Messages)) }

// tripResponsesModel plays the model of the Responses upstream.
func tripResponsesModel(req responsesim.Request) responsesim.Reply {
	return tripReply(toolResults(req.Items))
}

// toolResults is the results in a conversation: the content of its tool
// messages (Chat Completions) or the output of its function_call_output
// items (Responses).
func toolResults(conversation []json.RawMessage) []string {
	var results []string
	for _, raw := range conversation {
		var m struct {
			Role, Type, Content, Output string
		}
		_ = json.Unmarshal(raw, &m)
		switch {
		case m.Role == "tool":
			results = append(results, m.Content)
		case m.Type == "function_call_output":
			results = append(results, m.Output)
		}
	}
	return results
}

// tripMessagesModel plays the model of the Messages upstream: the results
// are the tool_result blocks of its last user message, a failed call's
// flagged is_error.
func tripMessagesModel(req anthropicsim.Request) anthropicsim.Reply {
	var results []string
	if n := len(req.Messages); n > 0 {
		var m struct {
			Content []struct {
				Type    string `json:"type"`
				Content string `json:"content"`
				IsError bool   `json:"is_error"`
			} `json:"content"`
		}
		_ = json.Unmarshal(req.Messages[n-1], &m)
		for _, b := range m.Content {
			switch {
			case b.Type != "tool_result":
			case b.IsError:
				results = append(results, "(is_error) "+b.Content)
			default:
				results = append(results, b.Content)
			}
		}
	}
	return tripReply(results)
}

// modelPart is one model API the demo runs the batch through: its
// simulator, the sidecar's endpoint, the application's request, and how
// the answer's stream reads.
type modelPart struct {
	heading    string
	kind       string
	sim        http.Handler
	violations func() []openaisim.Violation
	base       string // the API's base path under the simulator
	path       string // the sidecar's endpoint
	body       any
	// read reads the answer's stream, giving its text to text as it
	// comes, and returns how it ended.
	read func(sc *bufio.Scanner, text func(string)) (streamEnd, error)
}

// streamEnd is how an answer's stream ended.
type streamEnd struct {
	summary       string // what the stream's end said, for the transcript
	whole         bool   // it ended as the API ends a finished answer
	calls         []executor.CallResult
	input, output int // tokens over the turns
}

// chatUsage is what the demo reads of a Chat Completions usage (which
// also has objects of details, as OpenAI's does).
type chatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// answerEnd is what ends a Messages or Responses answer: the usage
// summed over the turns and the sidecar's calls.
type answerEnd struct {
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
	Toolsidecar *struct {
		Calls []executor.CallResult `json:"calls"`
	} `json:"toolsidecar"`
}

func (a answerEnd) into(end *streamEnd) {
	end.input, end.output = a.Usage.InputTokens, a.Usage.OutputTokens
	if a.Toolsidecar != nil {
		end.calls = a.Toolsidecar.Calls
	}
}

// runOpenAI is the demo's second part: the same tools and workers behind
// an OpenAI-compatible upstream (the simulator, streaming its tool calls
// as llama.cpp does, fragments of several calls interleaved), driven by
// an application that only speaks Chat Completions to the sidecar.
func runOpenAI(ctx context.Context, out io.Writer, passwordFile, password string) error {
	sim := openaisim.New(openaisim.Config{Profile: openaisim.LlamaCpp, Delay: 2 * time.Millisecond, Model: tripModel})
	return runModel(ctx, out, passwordFile, password, modelPart{
		heading: "part 2: the same tools behind an OpenAI-compatible upstream (a simulator streaming tool calls as llama.cpp does)",
		kind:    config.UpstreamOpenAI, sim: sim, violations: sim.Violations, base: "/v1", path: "/v1/chat/completions",
		body: map[string]any{"model": "llama-demo", "stream": true, "stream_options": map[string]bool{"include_usage": true},
			"messages": []map[string]string{{"role": "user", "content": "Plan my trip to New York."}}},
		read: readChatStream,
	})
}

// runMessages is the demo's third part: the same batch behind an
// Anthropic Messages upstream (the simulator, with extended thinking on:
// the thinking block is replayed with its signature), for an application
// that speaks the Messages API.
func runMessages(ctx context.Context, out io.Writer, passwordFile, password string) error {
	sim := anthropicsim.New(anthropicsim.Config{Delay: 2 * time.Millisecond, Model: tripMessagesModel})
	return runModel(ctx, out, passwordFile, password, modelPart{
		heading: "part 3: the same tools behind an Anthropic Messages upstream (a simulator with extended thinking on)",
		kind:    config.UpstreamAnthropic, sim: sim, violations: sim.Violations, path: "/v1/messages",
		body: map[string]any{"model": "claude-demo", "max_tokens": 4096, "stream": true, "thinking": map[string]any{"type": "enabled", "budget_tokens": 1024},
			"messages": []map[string]string{{"role": "user", "content": "Plan my trip to New York."}}},
		read: readMessagesStream,
	})
}

// runResponses is the demo's fourth part: the same batch behind an
// OpenAI Responses upstream (the simulator, with reasoning on: the
// reasoning item is replayed with its encrypted content), for an
// application that speaks the Responses API.
func runResponses(ctx context.Context, out io.Writer, passwordFile, password string) error {
	sim := responsesim.New(responsesim.Config{Delay: 2 * time.Millisecond, Model: tripResponsesModel})
	return runModel(ctx, out, passwordFile, password, modelPart{
		heading: "part 4: the same tools behind an OpenAI Responses upstream (a simulator with reasoning on)",
		kind:    config.UpstreamResponses, sim: sim, violations: sim.Violations, base: "/v1", path: "/v1/responses",
		body: map[string]any{"model": "gpt-demo", "stream": true, "reasoning": map[string]string{"effort": "low"},
			"input": "Plan my trip to New York."},
		read: readResponsesStream,
	})
}

// runModel serves m's simulator, starts a sidecar in front of it with the
// demo's workers, sends the application's streamed request, and prints
// the answer as it comes, the calls the sidecar ran, the usage and the
// simulator's contract log.
func runModel(ctx context.Context, out io.Writer, passwordFile, password string, m modelPart) error {
	s, stop, err := inFront(ctx, m.sim, m.kind, m.base, passwordFile, password)
	if err != nil {
		return err
	}
	defer stop()
	url := "http://" + s.Addr() + m.path
	fmt.Fprintf(out, "\n%s\nPOST %s, stream: true\n", m.heading, url)
	body, _ := json.Marshal(m.body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("demo: %s answered %d: %s", m.path, resp.StatusCode, b)
	}
	at := func() string { return fmt.Sprintf("[%7s]", ms(time.Since(t0))) }
	// The operator approving hold_room writes beside the stream's reader.
	var mu sync.Mutex
	var lastText time.Time
	printf := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format, a...)
	}
	stopApprover := approve(ctx, "http://"+s.Addr(), func(line string) {
		printf("\n%s %s", at(), line)
		mu.Lock()
		lastText = time.Time{} // the content goes on on a line of its own
		mu.Unlock()
	})
	defer stopApprover()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	end, err := m.read(sc, func(text string) {
		// Deltas that follow each other closely go on one line: a pause
		// (the tools running) starts another.
		mu.Lock()
		newLine := time.Since(lastText) > 200*time.Millisecond
		lastText = time.Now()
		mu.Unlock()
		if newLine {
			printf("\n%s content: ", at())
		}
		printf("%s", strings.ReplaceAll(text, "\n", "\n                    "))
	})
	stopApprover()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%s stream ended: %s\n", at(), end.summary)
	for _, c := range end.calls {
		status, problems := outcome(c)
		fmt.Fprintf(out, "  turn %d  %-17s %s %6dms  %s\n", c.Turn, c.Tool, c.ToolCallID, c.DurationMS, status)
		for _, p := range problems {
			fmt.Fprintf(out, "%45s%s\n", "", p)
		}
	}
	fmt.Fprintf(out, "usage over the turns: %d input + %d output tokens\n", end.input, end.output)
	if err := contractLog(out, m.violations()); err != nil {
		return err
	}
	switch {
	case !end.whole || len(end.calls) != len(Scenario().Turns[0].Calls):
		return fmt.Errorf("demo: the %s stream is not whole: %s, %d calls", m.kind, end.summary, len(end.calls))
	}
	return nil
}

// contractLog prints an upstream simulator's contract log, and is
// ErrContract when it is not empty.
func contractLog(out io.Writer, v []openaisim.Violation) error {
	fmt.Fprintf(out, "upstream contract log: %d violations\n", len(v))
	for _, x := range v {
		fmt.Fprintf(out, "  %s: %s\n", x.Code, x.Detail)
	}
	if len(v) > 0 {
		return ErrContract
	}
	return nil
}

// inFront serves sim, an upstream of kind whose API lives under base,
// and starts a sidecar in front of it, its API served (the application
// reaches it over HTTP), with the demo's workers; stop ends them all.
func inFront(ctx context.Context, sim http.Handler, kind, base, passwordFile, password string) (_ *sidecar.Sidecar, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	hs := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = hs.Serve(ln)
	}()
	stops := []func(){func() { _ = hs.Close(); <-served }}
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	s, err := startSidecar("http://127.0.0.1:9", passwordFile, func(c *config.Config) {
		c.Upstream.Kind, c.Upstream.URL = kind, "http://"+ln.Addr().String()+base
	})
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, serve(ctx, s))
	stopWorkers, err := startWorkers(s, password)
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, stopWorkers)
	return s, stop, nil
}

// readChatStream reads chat.completion.chunk events: one id, one finish
// chunk (stop), the usage, one [DONE].
func readChatStream(sc *bufio.Scanner, text func(string)) (streamEnd, error) {
	var (
		end          streamEnd
		finish, ids  []string
		done         int
		usage        chatUsage
		sawToolsInfo bool
	)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done++
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage       *chatUsage `json:"usage"`
			Toolsidecar *struct {
				Calls []executor.CallResult `json:"calls"`
			} `json:"toolsidecar"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return end, fmt.Errorf("demo: a chunk is not JSON: %w", err)
		}
		if len(c.Error) > 0 {
			return end, fmt.Errorf("demo: the stream reported an error: %s", c.Error)
		}
		ids = append(ids, c.ID)
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" {
				text(ch.Delta.Content)
			}
			if ch.FinishReason != nil {
				finish = append(finish, *ch.FinishReason)
			}
		}
		if c.Usage != nil {
			usage = *c.Usage
		}
		if c.Toolsidecar != nil {
			end.calls, sawToolsInfo = c.Toolsidecar.Calls, true
		}
	}
	end.summary = fmt.Sprintf("%d chunks with one id (%v), finish_reason %v, [DONE] %d time(s)", len(ids), oneID(ids), finish, done)
	end.whole = len(finish) == 1 && finish[0] == "stop" && done == 1 && oneID(ids) && sawToolsInfo
	end.input, end.output = usage.PromptTokens, usage.CompletionTokens
	return end, sc.Err()
}

// readMessagesStream reads the Messages API's named events: one
// message_start, blocks with dense indexes, one message_delta with the
// stop reason (end_turn) and the usage, then message_stop.
func readMessagesStream(sc *bufio.Scanner, text func(string)) (streamEnd, error) {
	var (
		end                 streamEnd
		events              = map[string]int{}
		name, stop          string
		blocks, denseBlocks int
	)
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			name = n
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		events[name]++
		var e struct {
			Index int `json:"index"`
			Delta struct {
				Type       string `json:"type"`
				Text       string `json:"text"`
				StopReason string `json:"stop_reason"`
			} `json:"delta"`
			answerEnd
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			return end, fmt.Errorf("demo: an event is not JSON: %w", err)
		}
		switch name {
		case "error":
			return end, fmt.Errorf("demo: the stream reported an error: %s", e.Error)
		case "content_block_start":
			if e.Index == blocks {
				denseBlocks++
			}
			blocks++
		case "content_block_delta":
			if e.Delta.Type == "text_delta" {
				text(e.Delta.Text)
			}
		case "message_delta":
			stop = e.Delta.StopReason
			e.answerEnd.into(&end)
		}
	}
	end.summary = fmt.Sprintf("message_start %d, %d content block(s) with dense indexes (%v), stop_reason %s, message_stop %d",
		events["message_start"], blocks, denseBlocks == blocks, stop, events["message_stop"])
	end.whole = events["message_start"] == 1 && events["message_delta"] == 1 && events["message_stop"] == 1 && stop == "end_turn" && denseBlocks == blocks
	return end, sc.Err()
}

// readResponsesStream reads the Responses API's events: sequence_numbers
// rising by one from 0, one response.created, output items added at
// dense output_indexes, and one response.completed, last, whose response
// has the usage.
func readResponsesStream(sc *bufio.Scanner, text func(string)) (streamEnd, error) {
	var (
		end              streamEnd
		events           = map[string]int{}
		seq, items       int
		inOrder, dense   = true, true
		status, terminal string
	)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var e struct {
			Type           string `json:"type"`
			SequenceNumber int    `json:"sequence_number"`
			OutputIndex    int    `json:"output_index"`
			Delta          string `json:"delta"`
			Response       struct {
				Status string `json:"status"`
				answerEnd
			} `json:"response"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			return end, fmt.Errorf("demo: an event is not JSON: %w", err)
		}
		events[e.Type]++
		inOrder = inOrder && e.SequenceNumber == seq && terminal == ""
		seq++
		switch e.Type {
		case "error", "response.failed":
			return end, fmt.Errorf("demo: the stream reported an error: %s", data)
		case "response.output_item.added":
			dense = dense && e.OutputIndex == items
			items++
		case "response.output_text.delta":
			text(e.Delta)
		case "response.completed", "response.incomplete":
			terminal, status = e.Type, e.Response.Status
			e.Response.answerEnd.into(&end)
		}
	}
	end.summary = fmt.Sprintf("%d events with sequence_numbers in order (%v), response.created %d, %d output item(s) at dense indexes (%v), %s (status %s)",
		seq, inOrder, events["response.created"], items, dense, terminal, status)
	end.whole = inOrder && dense && events["response.created"] == 1 && terminal == "response.completed" && status == "completed"
	return end, sc.Err()
}

func oneID(ids []string) bool {
	for _, id := range ids {
		if id != ids[0] {
			return false
		}
	}
	return len(ids) > 0
}
