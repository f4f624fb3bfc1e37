package core

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkExchangesOverTLS: short calls from 64 goroutines to a Core
// behind TLS, through the client's own transports (WithTLS) and through
// Go's default transport with the same TLS configuration, which the
// sidecar used before: it keeps 2 connections idle per host, so most
// requests of a burst pay a new connection and its handshake. Both run in
// one process against one server, to be compared as a ratio.
//
//	go test ./core -run '^$' -bench ExchangesOverTLS -benchtime 20000x
func BenchmarkExchangesOverTLS(b *testing.B) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id": "run_1", "status": "in_progress"}`))
	}))
	conns := countConns(srv)
	srv.StartTLS()
	defer srv.Close()
	tc := srv.Client().Transport.(*http.Transport).TLSClientConfig
	for _, bc := range []struct {
		name string
		opt  func() Option
	}{
		{"kept", func() Option { return WithTLS(tc) }},
		{"go-default-transport", func() Option {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.TLSClientConfig = tc.Clone()
			return WithHTTPClient(&http.Client{Transport: t})
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := New(Config{URL: srv.URL}, bc.opt())
			if err != nil {
				b.Fatal(err)
			}
			start := conns.Load()
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(conns.Load()-start)/float64(b.N), "conns/op")
			c.hc.CloseIdleConnections()
		})
	}
}

// BenchmarkShortCalls: a status write from 64 goroutines to a Core over
// plain HTTP in the same process, through the client's net/http
// transport: the cost of one Core write, server included.
//
//	go test ./core -run '^$' -bench ShortCalls -benchtime 50000x -count 4
func BenchmarkShortCalls(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id": "act_1", "status": "completed"}`))
	}))
	defer srv.Close()
	c, err := New(Config{URL: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	upd := ActionUpdate{Status: "completed"}
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.WriteAction(context.Background(), "act_1", upd); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	c.hc.CloseIdleConnections()
}
