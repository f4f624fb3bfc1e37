package core

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawCore is a Core on a raw listener: serve is given each connection
// it accepts, its requests read with br.
func rawCore(t *testing.T, serve func(conn net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				serve(conn, bufio.NewReader(conn))
			})
		}
	})
	return "http://" + ln.Addr().String()
}

// TestResponseHeadersBounded: a Core whose answer's headers never end,
// or which sends informational answers without end, fails the request
// once 10 MiB of headers have come (net/http's Transport's bound), not
// when the call's Timeout runs out with all of them held in memory.
func TestResponseHeadersBounded(t *testing.T) {
	for name, head := range map[string]func(w io.Writer) error{
		"endless headers": func(w io.Writer) error {
			if _, err := io.WriteString(w, "HTTP/1.1 200 OK\r\n"); err != nil {
				return err
			}
			line := "X-Pad: " + strings.Repeat("a", 1000) + "\r\n"
			for {
				if _, err := io.WriteString(w, line); err != nil {
					return err
				}
			}
		},
		"1xx flood": func(w io.Writer) error {
			for {
				if _, err := io.WriteString(w, "HTTP/1.1 102 Processing\r\nX-Pad: "+strings.Repeat("a", 1000)+"\r\n\r\n"); err != nil {
					return err
				}
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			url := rawCore(t, func(conn net.Conn, br *bufio.Reader) {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
				head(bufio.NewWriter(conn))
			})
			c, err := New(Config{URL: url, Timeout: 10 * time.Second, Retries: -1})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = c.GetRun(context.Background(), "run_1")
			if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "exceeded") {
				t.Fatalf("after %v: %v, want the header bound exceeded", time.Since(start), err)
			}
		})
	}
}
