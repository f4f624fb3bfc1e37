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
	"github.com/projectdavid/toolsidecar/openaisim"
)

// tripModel plays the model of the demo's OpenAI-compatible upstream: the
// first turn of Scenario (its text and its six calls), then an answer
// quoting each tool message in order.
func tripModel(req openaisim.Request) openaisim.Reply {
	var results []string
	for _, raw := range req.Messages {
		var m struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}
		_ = json.Unmarshal(raw, &m)
		if m.Role == "tool" {
			results = append(results, "- "+m.Content)
		}
	}
	if len(results) > 0 {
		return openaisim.Reply{Content: "Here is what I found:\n" + strings.Join(results, "\n")}
	}
	first := Scenario().Turns[0]
	r := openaisim.Reply{Content: first.Content}
	for _, c := range first.Calls {
		r.Calls = append(r.Calls, openaisim.Call{Name: c.Tool, Args: c.ArgsJSON})
	}
	return r
}

// runOpenAI is the demo's second part: the same tools and workers behind
// an OpenAI-compatible upstream (the simulator, streaming its tool calls
// as llama.cpp does, fragments of several calls interleaved), driven by
// an application that only speaks Chat Completions to the sidecar.
func runOpenAI(ctx context.Context, out io.Writer, passwordFile, password string) error {
	sim := openaisim.New(openaisim.Config{Profile: openaisim.LlamaCpp, Delay: 2 * time.Millisecond, Model: tripModel})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = hs.Serve(ln)
	}()
	defer func() {
		_ = hs.Close()
		<-served
	}()
	s, err := startSidecar("http://127.0.0.1:9", passwordFile, func(c *config.Config) {
		c.Upstream.Kind, c.Upstream.URL = config.UpstreamOpenAI, "http://"+ln.Addr().String()+"/v1"
	})
	if err != nil {
		return err
	}
	// The application reaches this sidecar over HTTP: its API is served.
	defer serve(ctx, s)()
	stopWorkers, err := startWorkers(s, password)
	if err != nil {
		return err
	}
	defer stopWorkers()
	url := "http://" + s.Addr() + "/v1/chat/completions"
	fmt.Fprintf(out, "\npart 2: the same tools behind an OpenAI-compatible upstream (a simulator streaming tool calls as llama.cpp does)\n")
	fmt.Fprintf(out, "POST %s, stream: true\n", url)
	body, _ := json.Marshal(map[string]any{"model": "llama-demo", "stream": true, "stream_options": map[string]bool{"include_usage": true},
		"messages": []map[string]string{{"role": "user", "content": "Plan my trip to New York."}}})
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
		return fmt.Errorf("demo: chat completion answered %d: %s", resp.StatusCode, b)
	}
	var (
		finish, ids []string
		done        int
		usage       map[string]int
		calls       []executor.CallResult
		lastText    time.Time
	)
	at := func() string { return fmt.Sprintf("[%7s]", ms(time.Since(t0))) }
	// The operator approving hold_room writes beside the stream's reader.
	var mu sync.Mutex
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
			Usage       map[string]int `json:"usage"`
			Toolsidecar *struct {
				Calls []executor.CallResult `json:"calls"`
			} `json:"toolsidecar"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return fmt.Errorf("demo: a chunk is not JSON: %w", err)
		}
		if len(c.Error) > 0 {
			return fmt.Errorf("demo: the stream reported an error: %s", c.Error)
		}
		ids = append(ids, c.ID)
		for _, ch := range c.Choices {
			if text := ch.Delta.Content; text != "" {
				// Deltas that follow each other closely go on one line:
				// a pause (the tools running) starts another.
				mu.Lock()
				newLine := time.Since(lastText) > 200*time.Millisecond
				lastText = time.Now()
				mu.Unlock()
				if newLine {
					printf("\n%s content: ", at())
				}
				printf("%s", strings.ReplaceAll(text, "\n", "\n                    "))
			}
			if ch.FinishReason != nil {
				finish = append(finish, *ch.FinishReason)
			}
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		if c.Toolsidecar != nil {
			calls = c.Toolsidecar.Calls
		}
	}
	stopApprover()
	if err := sc.Err(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%s stream ended: %d chunks with one id (%v), finish_reason %v, [DONE] %d time(s)\n",
		at(), len(ids), oneID(ids), finish, done)
	for _, c := range calls {
		status := "ok"
		if !c.OK {
			status = c.ErrorType + ": " + firstLine(c.Error)
		}
		fmt.Fprintf(out, "  turn %d  %-17s %s %6dms  %s\n", c.Turn, c.Tool, c.ToolCallID, c.DurationMS, status)
	}
	fmt.Fprintf(out, "usage over the turns: %d prompt + %d completion tokens\n", usage["prompt_tokens"], usage["completion_tokens"])
	v := sim.Violations()
	fmt.Fprintf(out, "upstream contract log: %d violations\n", len(v))
	for _, x := range v {
		fmt.Fprintf(out, "  %s: %s\n", x.Code, x.Detail)
	}
	switch {
	case len(v) > 0:
		return ErrContract
	case len(finish) != 1 || finish[0] != "stop" || done != 1 || !oneID(ids) || len(calls) != len(Scenario().Turns[0].Calls):
		return fmt.Errorf("demo: the OpenAI-compatible stream is not whole: finish %v, [DONE] %d, %d calls", finish, done, len(calls))
	}
	return nil
}

func oneID(ids []string) bool {
	for _, id := range ids {
		if id != ids[0] {
			return false
		}
	}
	return len(ids) > 0
}
