package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// h2cClient speaks HTTP/2 without TLS (prior knowledge) and counts the
// connections it opens.
func h2cClient(t *testing.T) (*http.Client, *atomic.Int32) {
	var dials atomic.Int32
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, &dials
}

// TestCleartextHTTP2: with server.http2_cleartext, drives share HTTP/2
// connections without TLS, at most server.max_streams at once on one: five
// drives that all wait for each other (their calls meet at a barrier)
// need three connections under max_streams 2, and each completes whole.
// Without the setting the API speaks HTTP/1.1 only.
func TestCleartextHTTP2(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		env := testenv.New(t, oneCall("echo"), testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
		client, _ := h2cClient(t)
		if resp, err := client.Get(env.URL + "/healthz"); err == nil {
			resp.Body.Close()
			t.Fatalf("HTTP/2 without TLS answered %s by default", resp.Proto)
		}
	})
	t.Run("on", func(t *testing.T) {
		const drives = 5
		var arrived sync.WaitGroup
		arrived.Add(drives)
		all := make(chan struct{})
		go func() { arrived.Wait(); close(all) }()
		meet := func(ctx context.Context, c *tool.Call) ([]byte, error) {
			arrived.Done()
			select {
			case <-all:
				return c.Args, nil
			case <-time.After(10 * time.Second):
				return nil, tool.NewError(tool.ToolFailed, "the other drives never came: they were not in flight at once")
			}
		}
		env := testenv.Start(t, oneCall("meet"), testenv.Options{Server: func(s *config.Server) { s.HTTP2Cleartext, s.MaxStreams = true, 2 }},
			testenv.Tool{Config: config.Tool{Name: "meet", Timeout: 20 * time.Second}, Handler: meet})
		client, dials := h2cClient(t)
		var wg sync.WaitGroup
		for range drives {
			r := env.NewRun()
			wg.Go(func() {
				body, _ := json.Marshal(r.DriveBody())
				resp, err := client.Post(env.URL+"/v1/runs/"+r.RunID+"/drive", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				var sum executor.Summary
				if err := json.NewDecoder(resp.Body).Decode(&sum); err != nil || resp.ProtoMajor != 2 || sum.Status != executor.StatusCompleted || len(sum.Calls) != 1 || !sum.Calls[0].OK {
					t.Errorf("%s %d: %+v %v", resp.Proto, resp.StatusCode, sum, err)
					return
				}
				env.AssertWholeBatches(r, 1)
			})
		}
		wg.Wait()
		if n := dials.Load(); n < 3 {
			t.Errorf("%d connections carried %d drives at once, want at least 3 under max_streams 2", n, drives)
		}
	})
}
