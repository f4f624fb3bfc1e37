package discovery_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/discovery"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// TestDescribe: on a real server, a describe request gets the declaration
// of a worker that serves the tool, a refusal from one that serves it
// without a declaration, "no responders" where nobody serves the subject,
// and nothing from a subscriber that stays silent; an answer over the
// bound is refused. The tool never runs for it.
func TestDescribe(t *testing.T) {
	url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ran := 0
	w := worker.New(nc, "p")
	if err := worker.Declare(w, "declared", worker.Spec{Description: strings.Repeat("d", 100)}, func(context.Context, *tool.Call, struct{}) (string, error) {
		ran++
		return "", nil
	}); err != nil {
		t.Fatal(err)
	}
	w.Handle("plain", func(context.Context, *tool.Call) ([]byte, error) { ran++; return nil, nil })
	natstest.Serve(t, w)
	silent, err := nc.QueueSubscribe("p.silent", "toolsidecar", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Unsubscribe()

	start := time.Now()
	got, err := discovery.Describe(context.Background(), nc, []string{"p.declared", "p.plain", "p.nobody", "p.silent"}, 0, 300*time.Millisecond, tool.MaxDeclarationBytes)
	if err != nil {
		t.Fatal(err)
	}
	if d := got[0]; len(d.Answers) != 1 || !strings.Contains(string(d.Answers[0].Declaration), `"description":"ddd`) || !strings.HasPrefix(d.Answers[0].Worker, "go ") {
		t.Errorf("declared: %+v", d)
	}
	if d := got[1]; len(d.Answers) != 0 || d.Refusals != 1 {
		t.Errorf("plain: %+v: want one refusal", d)
	}
	if d := got[2]; !d.NoResponders || len(d.Answers) != 0 {
		t.Errorf("nobody: %+v: want no responders", d)
	}
	if d := got[3]; d.NoResponders || len(d.Answers)+d.Refusals != 0 {
		t.Errorf("silent: %+v: want nothing", d)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Errorf("returned after %v with a silent subscriber: want the whole wait", waited)
	}
	small, err := discovery.Describe(context.Background(), nc, []string{"p.declared", "p.nobody"}, 0, 5*time.Second, 50)
	if err != nil {
		t.Fatal(err)
	}
	if small[0].Refusals != 1 || len(small[0].Answers) != 0 || !small[1].NoResponders {
		t.Errorf("bounded: %+v", small)
	}
	if ran != 0 {
		t.Errorf("a tool ran %d times for describe requests", ran)
	}
}

// TestDescribeRepeatedAnswers: on a real server, a worker that serves two
// tools answers the first one's describe request 400 times with 63 KiB
// each, then the second's once (answers of one worker come in order, so
// the second tells that the flood has come). The first declaration of
// each is kept; the 399 after it are counted and dropped unkept. Before,
// every one was kept: a flood of 4,000 grew the sidecar by 900 MB.
func TestDescribeRepeatedAnswers(t *testing.T) {
	url := natstest.Start(t)
	side, work := natstest.Dial(t, url), natstest.Dial(t, url)
	const repeats = 400
	body := []byte(`{"description":"` + strings.Repeat("x", 63<<10) + `"}`)
	flood, err := work.QueueSubscribe("p.*", "toolsidecar", func(m *nats.Msg) {
		n := 1
		if m.Subject == "p.first" {
			n = repeats
		}
		for range n {
			_ = m.Respond(body)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Unsubscribe()
	if err := work.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := discovery.Describe(context.Background(), side, []string{"p.first", "p.second"}, 0, 10*time.Second, tool.MaxDeclarationBytes)
	if err != nil {
		t.Fatal(err)
	}
	if d := got[0]; len(d.Answers) != 1 || d.Repeats != repeats-1 || d.Refusals != 0 || d.Cut {
		t.Errorf("first: %d answers kept, %d repeats, %d refusals, cut %v: want the first one kept and %d repeats", len(d.Answers), d.Repeats, d.Refusals, d.Cut, repeats-1)
	}
	if d := got[1]; len(d.Answers) != 1 || d.Repeats != 0 {
		t.Errorf("second: %d answers kept, %d repeats: want one", len(d.Answers), d.Repeats)
	}
}

// TestDescribeBytesBound: on a real server, 600 tools each answer with a
// declaration of 60 KiB, 35 MiB in all: the describe keeps declarations
// up to MaxDescribeBytes, marks the tool whose declaration would pass it
// as cut, and reads nothing after it.
func TestDescribeBytesBound(t *testing.T) {
	url := natstest.Start(t)
	nc, work := natstest.Dial(t, url), natstest.Dial(t, url)
	body := []byte(`{"description":"` + strings.Repeat("x", 60<<10) + `"}`)
	sub, err := work.QueueSubscribe("p.*", "toolsidecar", func(m *nats.Msg) { _ = m.Respond(body) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := work.Flush(); err != nil {
		t.Fatal(err)
	}
	subjects := make([]string, 600)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("p.t%d", i)
	}
	got, err := discovery.Describe(context.Background(), nc, subjects, 0, time.Minute, tool.MaxDeclarationBytes)
	if err != nil {
		t.Fatal(err)
	}
	kept, answered, cut := 0, 0, 0
	for _, d := range got {
		for _, a := range d.Answers {
			kept += len(a.Declaration)
		}
		answered += len(d.Answers)
		if d.Cut {
			cut++
		}
	}
	if want := discovery.MaxDescribeBytes / len(body); answered != want || cut != 1 || kept > discovery.MaxDescribeBytes {
		t.Errorf("%d declarations kept (%d bytes), %d cut: want %d, within %d bytes, and one cut", answered, kept, cut, want, discovery.MaxDescribeBytes)
	}
}
