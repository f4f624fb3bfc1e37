package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/discovery"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func service(id string, names ...string) discovery.ServiceInfo {
	info := discovery.ServiceInfo{ID: id}
	for _, name := range names {
		info.Endpoints = append(info.Endpoints, discovery.Endpoint{Name: name, Subject: "p." + name, Metadata: map[string]string{wire.ToolMetadataKey: "{}"}})
	}
	return info
}

func described(worker string, decls ...string) discovery.Described {
	var d discovery.Described
	for _, decl := range decls {
		d.Answers = append(d.Answers, discovery.Answer{Declaration: []byte(decl), Worker: worker})
	}
	return d
}

// TestAnnouncedNames: $SRV.INFO answers give names only: those under the
// prefix, valid, announced with a declaration, not in force, in the
// allow-list, and no more than the bound leaves room for.
func TestAnnouncedNames(t *testing.T) {
	b := newBusTools(config.NATS{SubjectPrefix: "p", DiscoverGrace: time.Second, DiscoverAllow: []string{"t*", "u"}}, nil)
	b.tools["t0"] = &declaredTool{}
	infos := []discovery.ServiceInfo{
		service("W1", "t0", "t1", "u", "v", "bad name"),
		service("W2", "t1", "t2"),
		{ID: "W3", Endpoints: []discovery.Endpoint{{Subject: "other.t3", Metadata: map[string]string{wire.ToolMetadataKey: "{}"}}, {Subject: "p.t4"}}},
	}
	fresh, problems := b.announced(infos)
	if strings.Join(fresh, ",") != "t1,u,t2" {
		t.Errorf("fresh names %v: want t1, u, t2", fresh)
	}
	if len(problems) != 1 || !strings.Contains(problems[0], "tool v is declared on the bus but not in nats.discover_allow") {
		t.Errorf("problems %q", problems)
	}

	many := make([]string, maxFreshPerLook+500)
	for i := range many {
		many[i] = fmt.Sprintf("t%04d", i)
	}
	fresh, _ = b.announced([]discovery.ServiceInfo{service("W", many...)})
	again, _ := b.announced([]discovery.ServiceInfo{service("W", many...)})
	if len(fresh) != maxFreshPerLook || len(again) != maxFreshPerLook || slices.Equal(fresh, again) {
		t.Errorf("%d then %d fresh names of %d: want %d each, drawn anew each look", len(fresh), len(again), len(many), maxFreshPerLook)
	}

	full := newBusTools(config.NATS{SubjectPrefix: "p", DiscoverGrace: time.Second}, nil)
	for i := range maxDeclaredTools {
		full.tools[fmt.Sprintf("t%04d", i)] = &declaredTool{}
	}
	changed, problems := full.answered("late", described("go W", `{}`), time.Now())
	if changed || full.tools["late"] != nil || len(problems) != 1 || !strings.Contains(problems[0], "more than 1000 tools") {
		t.Errorf("a tool over the bound: changed %v, problems %q", changed, problems)
	}
}

// TestDescribeAnswers: a declaration comes in with the first worker that
// may serve the tool; another that declares it otherwise is a conflict and
// changes nothing, in the same look or a later one; a declaration that does
// not parse is left out; a silence within the grace keeps the tool, past
// it or with nobody serving the subject the tool leaves; a refused
// declaration is replaced by a changed one.
func TestDescribeAnswers(t *testing.T) {
	a := `{"description":"A","parameters":{"type":"object"}}`
	aSpaced := `{"parameters": {"type": "object"}, "description": "A"}`
	b2 := `{"description":"B","side_effects":"read_only","retries":3}`
	bus := newBusTools(config.NATS{SubjectPrefix: "p", DiscoverGrace: 5 * time.Second}, nil)
	now := time.Unix(1000, 0)

	changed, problems := bus.answered("t", described("go W1", a, b2, `{"description": 1}`), now)
	if !changed || bus.tools["t"].Declaration.Description != "A" || strings.Join(bus.tools["t"].By, ",") != "go worker W1" {
		t.Fatalf("t in force as %+v (changed %v): want the first answer's", bus.tools["t"], changed)
	}
	all := strings.Join(problems, "\n")
	for _, want := range []string{"tool t declared by go worker W1 is left out", "go worker W1 declares it otherwise than go worker W1, whose declaration stays"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems %q: want %q", all, want)
		}
	}
	if changed, problems = bus.answered("t", described("node W2", aSpaced), now.Add(time.Second)); changed || len(problems) != 0 {
		t.Errorf("the same declaration spaced otherwise: changed %v, problems %q", changed, problems)
	}
	changed, problems = bus.answered("t", described("python evil\nid", b2), now.Add(2*time.Second))
	if changed || bus.tools["t"].Declaration.Description != "A" || len(problems) != 1 || !strings.Contains(problems[0], "python worker without an ID declares it otherwise") {
		t.Errorf("a later conflicting answer: changed %v, in force %+v, problems %q", changed, bus.tools["t"].Declaration, problems)
	}

	if changed, _ = bus.answered("t", discovery.Described{}, now.Add(6*time.Second)); changed || bus.tools["t"] == nil {
		t.Error("a silence within the grace removed the tool")
	}
	if changed, _ = bus.answered("t", discovery.Described{}, now.Add(8*time.Second)); !changed || bus.tools["t"] != nil {
		t.Error("a silence past the grace kept the tool")
	}
	bus.answered("t", described("go W1", a), now)
	if changed, _ = bus.answered("t", discovery.Described{NoResponders: true}, now); !changed || bus.tools["t"] != nil {
		t.Error("nobody serves the subject, and the tool stayed")
	}

	bus.answered("t", described("go W1", a), now)
	bus.refuse([]*registry.DeclarationError{{Tool: "t"}})
	if len(bus.declared()) != 0 {
		t.Error("a refused declaration is offered to the registry again")
	}
	if changed, _ = bus.answered("t", described("go W1", b2), now); !changed || bus.tools["t"].refused || bus.tools["t"].Declaration.Description != "B" {
		t.Errorf("a refused declaration is not replaced by a changed one: %+v", bus.tools["t"])
	}
	if got := bus.unreported([]string{"x", "y", "x"}); strings.Join(got, ",") != "x,y" || len(bus.unreported([]string{"x"})) != 0 {
		t.Errorf("problems reported again: %v", got)
	}
}

// FuzzHostileDeclarer: whatever a bus client answers to $SRV.INFO and to a
// describe request, discovery keeps only valid names under the prefix,
// names its declarers by tokens only, stays within its bounds, and the
// registry compiled from what it keeps does not panic.
func FuzzHostileDeclarer(f *testing.F) {
	f.Add([]byte(`{"endpoints":[{"subject":"p.t","metadata":{"toolsidecar.tool":"{}"}}]}`), []byte(`{"description":"x","parameters":{"type":"object"}}`), "go W1")
	f.Add([]byte(`{"endpoints":[{"subject":"p.s","metadata":{"toolsidecar.tool":""}}]}`), []byte(`{"parameters":{"type":"string"}}`), "node \n")
	f.Add([]byte(`{"endpoints":[{"subject":"p.r","metadata":{"toolsidecar.tool":"x"}}]}`), []byte(`{"parameters":{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}}`), "python x")
	cfg := config.Default()
	cfg.NATS.SubjectPrefix = "p"
	base, err := registry.New(context.Background(), cfg, registry.Base(nil))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, info, decl []byte, worker string) {
		var si discovery.ServiceInfo
		if json.Unmarshal(info, &si) != nil {
			return
		}
		b := newBusTools(cfg.NATS, nil)
		fresh, _ := b.announced([]discovery.ServiceInfo{si, si})
		if len(fresh) > maxFreshPerLook {
			t.Fatalf("%d fresh names", len(fresh))
		}
		for _, name := range fresh {
			if !tool.ValidName(name) || si.Endpoints == nil {
				t.Fatalf("fresh name %q", name)
			}
			b.answered(name, discovery.Described{Answers: []discovery.Answer{{Declaration: decl, Worker: worker}}}, time.Now())
		}
		for name, dt := range b.tools {
			if !slices.Contains(fresh, name) || len(dt.By) != 1 || strings.ContainsAny(dt.By[0], "\r\n") {
				t.Fatalf("in force: %q by %q", name, dt.By)
			}
		}
		if _, _, err := b.compile(base); err != nil && len(registry.DeclarationErrors(err)) == 0 {
			t.Fatalf("compile: %v", err)
		}
	})
}

// BenchmarkDiscoveryLook: one look of discovery in the steady state, with
// 1,000 tools declared by a worker on a real server (its answers come
// from the same process): the $SRV.INFO probe (which waits its 250 ms),
// and a describe request for each tool in force. cpu-ms/look is the
// process's CPU (user and system) per look, both sides of the bus.
func BenchmarkDiscoveryLook(b *testing.B) {
	url := natstest.Start(b)
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	decls := map[string]string{}
	for i := range maxDeclaredTools {
		decls[fmt.Sprintf("t%04d", i)] = `{"description":"a tool","parameters":{"type":"object","properties":{"q":{"type":"string"}}},"side_effects":"read_only"}`
	}
	var eps []discovery.Endpoint
	for name, d := range decls {
		eps = append(eps, discovery.Endpoint{Name: name, Subject: "p." + name, Metadata: map[string]string{wire.ToolMetadataKey: d}})
		if _, err := nc.QueueSubscribe("p."+name, wire.QueueGroup, func(m *nats.Msg) { _ = m.Respond([]byte(d)) }); err != nil {
			b.Fatal(err)
		}
	}
	info, _ := json.Marshal(discovery.ServiceInfo{Name: wire.ServiceName, ID: "W", Endpoints: eps})
	if _, err := nc.Subscribe(discovery.InfoSubject, func(m *nats.Msg) { _ = m.Respond(info) }); err != nil {
		b.Fatal(err)
	}
	bus := newBusTools(config.NATS{SubjectPrefix: "p", DiscoverGrace: time.Minute}, nil)
	if _, _, err := bus.look(context.Background(), nc, time.Now()); err != nil || len(bus.tools) != maxDeclaredTools {
		b.Fatalf("%d tools in force after the first look (%v)", len(bus.tools), err)
	}
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if changed, _, err := bus.look(context.Background(), nc, time.Now()); err != nil || changed {
			b.Fatalf("a steady look changed the tools (%v)", err)
		}
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) / time.Duration(b.N)
	b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms/look")
}

// TestDescribeBoundKeepsToolsInForce: on a real server, an honest worker
// serves t, in force, and answers its describe request only once another
// bus client has answered enough of its own, with 60 KiB declarations, to
// pass discovery.MaxDescribeBytes: it announces 600 names, so that every
// look is cut. Through looks a grace apart, t stays in force: the bound
// leaves out fresh names, never a tool in force (#75; before, the look
// ended at the bound, t's answer went unread, and t left the registry
// once its grace passed).
func TestDescribeBoundKeepsToolsInForce(t *testing.T) {
	url := natstest.Start(t)
	side, honest, hostile := natstest.Dial(t, url), natstest.Dial(t, url), natstest.Dial(t, url)
	big := []byte(`{"side_effects":"read_only","parameters":{"type":"object","description":"` + strings.Repeat("x", 60<<10) + `"}}`)
	passBound := discovery.MaxDescribeBytes/len(big) + 1

	var mu sync.Mutex
	need := 0                    // hostile answers still to send before t's worker answers
	ready := make(chan struct{}) // closed when need reaches 0
	close(ready)
	subscribe := func(nc *nats.Conn, subject string, h nats.MsgHandler) {
		sub, err := nc.Subscribe(subject, h)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	subscribe(honest, discovery.InfoSubject, func(m *nats.Msg) { _ = m.Respond(infoOf(service("H", "t"))) })
	subscribe(honest, "p.t", func(m *nats.Msg) {
		mu.Lock()
		r := ready
		mu.Unlock()
		select {
		case <-r:
		case <-time.After(time.Minute):
		}
		_ = m.Respond([]byte(`{"description":"honest t","side_effects":"read_only"}`))
	})

	if err := honest.Flush(); err != nil {
		t.Fatal(err)
	}
	left := newLeftOutCounter(prometheus.NewRegistry())
	bus := newBusTools(config.NATS{SubjectPrefix: "p", DiscoverGrace: time.Second}, left)
	bus.wait = time.Minute // a look ends when its answers are in, or at the bound
	now := time.Unix(1000, 0)
	if _, _, err := bus.look(context.Background(), side, now); err != nil || bus.tools["t"] == nil {
		t.Fatalf("t not in force after the first look (%v)", err)
	}

	var fakes []string
	for i := range 600 {
		fakes = append(fakes, fmt.Sprintf("aa%03d", i))
	}
	subscribe(hostile, discovery.InfoSubject, func(m *nats.Msg) { _ = m.Respond(infoOf(service("X", fakes...))) })
	subscribe(hostile, "p.*", func(m *nats.Msg) {
		if m.Subject == "p.t" {
			return
		}
		_ = m.Respond(big)
		mu.Lock()
		defer mu.Unlock()
		if need > 0 {
			if need--; need == 0 && hostile.Flush() == nil { // NATS delivers the flood before t's answer
				close(ready)
			}
		}
	})
	if err := hostile.Flush(); err != nil {
		t.Fatal(err)
	}

	for look := 1; look <= 3; look++ {
		mu.Lock()
		need, ready = passBound, make(chan struct{})
		mu.Unlock()
		cut := testutil.ToFloat64(left.WithLabelValues(leftOverBytes))
		now = now.Add(2 * time.Second) // past the grace of the answer before
		if _, _, err := bus.look(context.Background(), side, now); err != nil {
			t.Fatal(err)
		}
		if testutil.ToFloat64(left.WithLabelValues(leftOverBytes)) == cut {
			t.Fatalf("look %d was not cut at the bound", look)
		}
		if bus.tools["t"] == nil {
			t.Fatalf("look %d: t left the registry (%d tools in force)", look, len(bus.tools))
		}
	}
	if len(bus.tools) > passBound {
		t.Errorf("%d tools in force: the fresh names passed the bound", len(bus.tools))
	}
}

// infoOf is info as a service sends it on $SRV.INFO.
func infoOf(info discovery.ServiceInfo) []byte {
	b, _ := json.Marshal(info)
	return b
}
