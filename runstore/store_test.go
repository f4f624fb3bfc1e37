package runstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/runstore"
)

// golden is a run as sidecars before this package wrote it, one record of
// each kind, written out by hand: the store must read these records, and
// write its own byte for byte alike, or a journal in JetStream no longer
// resumes its runs. Turn 1's calls have their outputs in turn 2's record
// (act-1) and in a record of their own (act-2); turn 2, which failed,
// handed over three calls: one with an output, one marked started, one
// not.
var golden = map[string]string{
	"run.chatcmpl-1": `{"request":"d1","created":1700000000,"claims":2}`,
	"turn.chatcmpl-1.1": `{"content":"hello","usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"cache_read_input_tokens":3,"reasoning_tokens":2},` +
		`"model":"gpt-x","created":1700000001,"finish":"tool_calls","assistant":{"role":"assistant"},` +
		`"calls":[{"message_id":"call_1","action_id":"act-1","tool_call_id":"call_1","tool":"echo","args":{"n":1},"problem":"p"},` +
		`{"message_id":"call_2","action_id":"act-2","tool_call_id":"call_2","tool":"echo","args":{"n":2}}],` +
		`"app_calls":[{"id":"call_app","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"x\"}"}}]}`,
	"turn.chatcmpl-1.2": `{"content":"","usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0},"failed":"boom",` +
		`"previous":{"act-1":"one"},` +
		`"handed":[{"message_id":"","action_id":"act-3","tool_call_id":"call_3","tool":"echo","args":{}},` +
		`{"message_id":"","action_id":"act-4","tool_call_id":"call_4","tool":"pay","args":{}},` +
		`{"message_id":"","action_id":"act-5","tool_call_id":"call_5","tool":"pay","args":{}}]}`,
	"outs.chatcmpl-1.1": `{"act-2":"two"}`,
	"outs.chatcmpl-1.2": `{"act-3":"three"}`,
	"start.act-4":       `1`,
	"end.chatcmpl-1":    `{"summary":{"run_id":"chatcmpl-1","upstream":"","status":"completed","turns":2,"content":"","calls":null}}`,
	"key.d1":            `{"runs":["chatcmpl-0","chatcmpl-1"]}`,
}

// journalOf is a memory journal holding records.
func journalOf(t *testing.T, records map[string]string) runstore.Journal {
	t.Helper()
	j := runstore.NewMemoryJournal(time.Minute, 1<<20)
	for k, v := range records {
		if err := j.Put(context.Background(), k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	return j
}

// field is the raw member name of a JSON record.
func field(t *testing.T, record, name string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(record), &m); err != nil {
		t.Fatal(err)
	}
	return string(m[name])
}

// Records written before this package read back as they were written.
func TestReadGolden(t *testing.T) {
	ctx := context.Background()
	s := runstore.New(journalOf(t, golden))
	run, err := s.Read(ctx, "chatcmpl-1")
	if err != nil || run == nil {
		t.Fatalf("Read: %v, %v", run, err)
	}
	if want := (runstore.Header{Request: "d1", Created: 1700000000, Claims: 2}); run.Header != want {
		t.Errorf("header %+v, want %+v", run.Header, want)
	}
	if len(run.Turns) != 2 {
		t.Fatalf("%d turns, want 2", len(run.Turns))
	}
	t1, t2 := run.Turns[0], run.Turns[1]
	if t1.Content != "hello" || t1.Model != "gpt-x" || t1.Created != 1700000001 || t1.Finish != "tool_calls" ||
		string(t1.Assistant) != `{"role":"assistant"}` || string(t1.Usage) != field(t, golden["turn.chatcmpl-1.1"], "usage") ||
		string(t1.AppCalls) != field(t, golden["turn.chatcmpl-1.1"], "app_calls") {
		t.Errorf("turn 1 %+v", t1)
	}
	wantCall := runstore.Call{MessageID: "call_1", ActionID: "act-1", ToolCallID: "call_1", Tool: "echo", Args: json.RawMessage(`{"n":1}`), Problem: "p"}
	if len(t1.Calls) != 2 || fmt.Sprint(t1.Calls[0]) != fmt.Sprint(wantCall) {
		t.Errorf("turn 1's calls %+v, want the first %+v", t1.Calls, wantCall)
	}
	if t2.Failed != "boom" || len(t2.Handed) != 3 || t2.Previous["act-1"] != "one" {
		t.Errorf("turn 2 %+v", t2)
	}
	if want := map[string]string{"act-1": "one", "act-2": "two", "act-3": "three"}; !maps.Equal(run.Outputs, want) {
		t.Errorf("outputs %v, want %v", run.Outputs, want)
	}
	if want := map[string]bool{"act-4": true, "act-5": false}; !maps.Equal(run.Started, want) {
		t.Errorf("starts %v, want %v", run.Started, want)
	}
	if run.End == nil || string(run.End.Summary) != field(t, golden["end.chatcmpl-1"], "summary") {
		t.Errorf("end %+v", run.End)
	}
	if runs, err := s.Runs(ctx, "d1"); err != nil || !slices.Equal(runs, []string{"chatcmpl-0", "chatcmpl-1"}) {
		t.Errorf("index %v (%v)", runs, err)
	}
	if run, err := s.Read(ctx, "chatcmpl-2"); run != nil || err != nil {
		t.Errorf("a run without a header: %+v (%v), want nil", run, err)
	}
}

// The store writes each record as the golden run holds it, byte for byte.
func TestWriteGolden(t *testing.T) {
	ctx := context.Background()
	j := runstore.NewMemoryJournal(time.Minute, 1<<20)
	s := runstore.New(j)
	read := runstore.New(journalOf(t, golden))
	run, err := read.Read(ctx, "chatcmpl-1")
	if err != nil || run == nil {
		t.Fatalf("Read: %v, %v", run, err)
	}
	// The header is written with no claim; a claim counts the rest.
	h := run.Header
	h.Claims = 0
	steps := []error{
		s.WriteHeader(ctx, "chatcmpl-1", h),
		s.WriteTurn(ctx, "chatcmpl-1", 1, run.Turns[0]),
		s.WriteTurn(ctx, "chatcmpl-1", 2, run.Turns[1]),
		s.WriteOutputs(ctx, "chatcmpl-1", 1, map[string]string{"act-2": "two"}),
		s.WriteOutputs(ctx, "chatcmpl-1", 2, map[string]string{"act-3": "three"}),
		s.MarkStarted(ctx, "act-4"),
		s.WriteEnd(ctx, "chatcmpl-1", *run.End),
		s.Index(ctx, "d1", "chatcmpl-0"),
		s.Index(ctx, "d1", "chatcmpl-1"),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for range 2 {
		if _, _, err := s.Claim(ctx, "chatcmpl-1"); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(golden)) {
		got, _, err := j.Get(ctx, key)
		if err != nil || string(got) != golden[key] {
			t.Errorf("%s: wrote\n%s (%v), want\n%s", key, got, err, golden[key])
		}
	}
}

// WriteHeader keeps the header a run has.
func TestWriteHeaderKeepsTheFirst(t *testing.T) {
	ctx := context.Background()
	s := runstore.New(runstore.NewMemoryJournal(time.Minute, 1<<20))
	for _, d := range []string{"first", "second"} {
		if err := s.WriteHeader(ctx, "r", runstore.Header{Request: d}); err != nil {
			t.Fatal(err)
		}
	}
	if h, ok, err := s.Header(ctx, "r"); err != nil || !ok || h.Request != "first" {
		t.Fatalf("header %+v, %v (%v), want the first", h, ok, err)
	}
	if _, ok, err := s.Header(ctx, "none"); ok || err != nil {
		t.Fatalf("a missing header: %v (%v)", ok, err)
	}
}

// barrier holds every Get of one key, once it has read the record, until
// n of them have: the claimers all read the same revision before any of
// them writes.
type barrier struct {
	runstore.Journal
	key string
	n   int

	mu      sync.Mutex
	arrived int
	all     chan struct{}
}

func (b *barrier) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	v, rev, err := b.Journal.Get(ctx, key)
	if key != b.key {
		return v, rev, err
	}
	b.mu.Lock()
	if b.arrived++; b.arrived == b.n {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
		return v, rev, err
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
}

// Of two requests that claim a run at once, exactly one takes it over;
// the header counts that one claim. A run without a header is no one's
// to claim.
func TestClaimOneOfTwo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mem := journalOf(t, map[string]string{"run.r": `{"request":"d","created":1,"claims":0}`})
	s := runstore.New(&barrier{Journal: mem, key: "run.r", n: 2, all: make(chan struct{})})
	var wins [2]bool
	var wg sync.WaitGroup
	for i := range wins {
		wg.Go(func() {
			h, ok, err := s.Claim(ctx, "r")
			if err != nil || h.Request != "d" {
				t.Errorf("claim %d: %+v (%v)", i, h, err)
			}
			wins[i] = ok
		})
	}
	wg.Wait()
	if wins[0] == wins[1] {
		t.Fatalf("claims won %v, want exactly one", wins)
	}
	if h, _, err := runstore.New(mem).Header(ctx, "r"); err != nil || h.Claims != 1 {
		t.Fatalf("header %+v (%v), want one claim", h, err)
	}
	if _, ok, err := runstore.New(mem).Claim(ctx, "none"); ok || err != nil {
		t.Fatalf("claiming a run without a header: %v (%v)", ok, err)
	}
}

// Ended and End tell a run that ended from one that did not.
func TestEnd(t *testing.T) {
	ctx := context.Background()
	s := runstore.New(journalOf(t, golden))
	for id, want := range map[string]bool{"chatcmpl-1": true, "chatcmpl-2": false} {
		ended, err := s.Ended(ctx, id)
		end, rerr := s.End(ctx, id)
		if err != nil || rerr != nil || ended != want || (end != nil) != want {
			t.Errorf("%s: ended %v, end %+v (%v, %v), want %v", id, ended, end, err, rerr, want)
		}
	}
}

// maxIndexed is the number of runs an index keeps (Store.Index).
const maxIndexed = 16

// The index of a request lists its runs newest last, keeps the newest
// maxIndexed, and loses a run only when it is removed; removing a run it
// does not list writes nothing.
func TestRunIndex(t *testing.T) {
	ctx := context.Background()
	j := runstore.NewMemoryJournal(time.Minute, 1<<20)
	s := runstore.New(j)
	indexed := func(digest string) ([]string, uint64) {
		t.Helper()
		runs, err := s.Runs(ctx, digest)
		if err != nil {
			t.Fatal(err)
		}
		_, rev, _ := j.Get(ctx, "key."+digest)
		return runs, rev
	}
	var want []string
	for i := range maxIndexed + 2 {
		id := fmt.Sprintf("chatcmpl-%d", i)
		if err := s.Index(ctx, "d", id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	want = want[2:]
	if got, _ := indexed("d"); !slices.Equal(got, want) {
		t.Fatalf("index %v, want the newest %d: %v", got, maxIndexed, want)
	}
	if err := s.Unindex(ctx, "d", "chatcmpl-5"); err != nil {
		t.Fatal(err)
	}
	want = slices.DeleteFunc(want, func(id string) bool { return id == "chatcmpl-5" })
	got, rev := indexed("d")
	if !slices.Equal(got, want) {
		t.Fatalf("index %v after removing chatcmpl-5, want %v", got, want)
	}
	for _, id := range []string{"chatcmpl-5", "chatcmpl-0"} {
		if err := s.Unindex(ctx, "d", id); err != nil {
			t.Fatal(err)
		}
	}
	if _, after := indexed("d"); after != rev {
		t.Fatalf("removing runs the index does not list rewrote it (revision %d, then %d)", rev, after)
	}
	if err := s.Unindex(ctx, "other", "chatcmpl-1"); err != nil {
		t.Fatal(err)
	}
	if got, rev := indexed("other"); got != nil || rev != 0 {
		t.Fatalf("removing a run from an absent index wrote %v", got)
	}
}

// Runs indexed at once under one digest are all kept: the compare-and-set
// is retried.
func TestIndexConcurrent(t *testing.T) {
	ctx := context.Background()
	s := runstore.New(runstore.NewMemoryJournal(time.Minute, 1<<20))
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if err := s.Index(ctx, "d", fmt.Sprintf("r-%d", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if runs, err := s.Runs(ctx, "d"); err != nil || len(runs) != 4 {
		t.Fatalf("index %v (%v), want the 4 runs", runs, err)
	}
}

// The memory journal's conditional writes fail with the package's errors.
func TestMemoryJournal(t *testing.T) {
	ctx := context.Background()
	j := runstore.NewMemoryJournal(time.Minute, 1<<20)
	if v, rev, err := j.Get(ctx, "k"); v != nil || rev != 0 || err != nil {
		t.Fatalf("missing record: %q %d %v", v, rev, err)
	}
	if _, err := j.Update(ctx, "k", []byte("x"), 1); !errors.Is(err, runstore.ErrChanged) {
		t.Fatalf("update of a missing record: %v, want ErrChanged", err)
	}
	rev, err := j.Create(ctx, "k", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Create(ctx, "k", []byte("b")); !errors.Is(err, runstore.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	next, err := j.Update(ctx, "k", []byte("c"), rev)
	if err != nil || next <= rev {
		t.Fatalf("update at its revision: %d (%v)", next, err)
	}
	if _, err := j.Update(ctx, "k", []byte("d"), rev); !errors.Is(err, runstore.ErrChanged) {
		t.Fatalf("update at an old revision: %v, want ErrChanged", err)
	}
	if v, got, _ := j.Get(ctx, "k"); string(v) != "c" || got != next {
		t.Fatalf("record %q at %d, want c at %d", v, got, next)
	}
}

// Digests and action ids are keys of records that outlive a sidecar (and
// the workers' idempotency keys): they never change, and parts cut
// elsewhere digest apart.
func TestDigests(t *testing.T) {
	for _, tc := range []struct{ name, got, want string }{
		{"Digest", runstore.Digest([]byte("a"), []byte("bc")), "5310a58788781ab25d5ad7c3f85035824b4eb7bdfa394e0ac2186271472b5492"},
		{"ShortDigest", runstore.ShortDigest([]byte("a"), []byte("bc")), "5310a58788781ab25d5ad7c3f85035"},
		{"ActionID", runstore.ActionID("chatcmpl-1", 2, 0, "call_1", "echo", `{"n":1}`), "act-f600c50037918ac7a53de3ad6ad41c"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
	if runstore.Digest([]byte("ab"), []byte("c")) == runstore.Digest([]byte("a"), []byte("bc")) {
		t.Error("parts cut elsewhere digest alike")
	}
}

// TestAnswerKeepsTheFirst: a hosted call's answer, once written, is the
// one that stands: a later write (a sidecar that ran the call again after
// a crash) gets the first back, and a start mark reads as started.
func TestAnswerKeepsTheFirst(t *testing.T) {
	ctx := context.Background()
	s := runstore.New(runstore.NewMemoryJournal(time.Hour, 1<<20))
	if a, err := s.Answer(ctx, "ha_1"); a != nil || err != nil {
		t.Fatalf("no answer yet: %+v %v", a, err)
	}
	first := runstore.Answer{OK: true, Output: "one"}
	if got, isFirst, err := s.WriteAnswer(ctx, "ha_1", first); err != nil || got != first || !isFirst {
		t.Fatalf("first write: %+v %v %v", got, isFirst, err)
	}
	if got, isFirst, err := s.WriteAnswer(ctx, "ha_1", runstore.Answer{OK: false, Output: "two"}); err != nil || got != first || isFirst {
		t.Fatalf("second write: %+v %v %v, want the first %+v", got, isFirst, err, first)
	}
	if started, err := s.Started(ctx, "ha_2"); started || err != nil {
		t.Fatalf("not marked: %v %v", started, err)
	}
	if err := s.MarkStarted(ctx, "ha_2"); err != nil {
		t.Fatal(err)
	}
	if started, err := s.Started(ctx, "ha_2"); !started || err != nil {
		t.Fatalf("marked: %v %v", started, err)
	}
}
