package discovery_test

import (
	"context"
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
	got, err := discovery.Describe(context.Background(), nc, []string{"p.declared", "p.plain", "p.nobody", "p.silent"}, 300*time.Millisecond, tool.MaxDeclarationBytes)
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
	small, err := discovery.Describe(context.Background(), nc, []string{"p.declared", "p.nobody"}, 5*time.Second, 50)
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
