package simbase

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// TestScript: a script's rounds become calls (raw_arguments as written, no
// arguments as ""), then the answer with the last round's results; other
// text is no script.
func TestScript(t *testing.T) {
	s, ok := ParseScript(`{"rounds": [[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "raw_arguments": "{oops"}, {"name": "c"}]], "answer": "ok. "}`)
	if !ok {
		t.Fatal("a script read as none")
	}
	r := s.Reply(0, nil)
	if want := []Call{{"a", `{"x": 1}`}, {"b", "{oops"}, {"c", ""}}; !slices.Equal(r.Calls, want) || r.Content != "" {
		t.Errorf("round 0: %+v, want calls %+v", r, want)
	}
	if r := s.Reply(1, []string{"1", "2"}); r.Content != "ok. results: 1 | 2" || len(r.Calls) != 0 {
		t.Errorf("after the last round: %+v", r)
	}
	for _, text := range []string{"hello", `{"rounds": []}`, `{"answer": "x"}`} {
		if _, ok := ParseScript(text); ok {
			t.Errorf("%q read as a script", text)
		}
	}
}

// TestTurnsReplayed: a replay matches any turn said after its
// conversation, part by part as Canonical sees them; another
// conversation's turn is unknown.
func TestTurnsReplayed(t *testing.T) {
	raws := func(s ...string) []json.RawMessage {
		var out []json.RawMessage
		for _, x := range s {
			out = append(out, json.RawMessage(x))
		}
		return out
	}
	tu := Turns{Noun: "items", Canonical: func(r json.RawMessage) string { return string(r) }}
	tu.Said("c", raws(`1`, `2`))
	tu.Said("c", raws(`3`))
	for _, c := range []struct {
		conv  string
		turn  []json.RawMessage
		known bool
		why   string
	}{
		{"c", raws(`1`, `2`), true, ""},
		{"c", raws(`3`), true, ""},
		{"c", raws(`1`, `9`), true, "the model said 1 items, replayed as 2"}, // the last answer's reason
		{"c", raws(`4`), true, "item 0 was 3, replayed as 4"},
		{"other", raws(`1`), false, ""},
	} {
		if known, why := tu.Replayed(c.conv, c.turn); known != c.known || why != c.why {
			t.Errorf("%s %s: known %v, %q; want %v, %q", c.conv, c.turn, known, why, c.known, c.why)
		}
	}
}

// TestBase: faults go to requests in order, the contract log is served,
// Check returns the first refusal, and a turn delivered twice is a repeat.
func TestBase(t *testing.T) {
	var b Base[Fault]
	b.Route("POST /x", func(w http.ResponseWriter, r *http.Request) {
		_, f := b.Begin()
		if f.Answer(w, func(w http.ResponseWriter, status int) { w.WriteHeader(status) }) {
			return
		}
		b.Delivered("conv")
	})
	b.Inject(Fault{Status: 429, RetryAfter: "2"})
	for _, want := range []int{429, 200, 200} {
		rec := httptest.NewRecorder()
		b.ServeHTTP(rec, httptest.NewRequest("POST", "/x", nil))
		if rec.Code != want || (want == 429 && rec.Header().Get("Retry-After") != "2") {
			t.Errorf("status %d (Retry-After %q), want %d", rec.Code, rec.Header().Get("Retry-After"), want)
		}
	}
	if b.Requests() != 3 || b.Repeats() != 1 {
		t.Errorf("%d requests, %d repeats; want 3, 1", b.Requests(), b.Repeats())
	}
	first := b.Check(func(refuse Refuse) {
		refuse("a", "first %d", 1)
		refuse("b", "second")
	})
	if first != "first 1" || len(b.Violations()) != 2 {
		t.Errorf("Check returned %q with %+v", first, b.Violations())
	}
	rec := httptest.NewRecorder()
	b.ServeHTTP(rec, httptest.NewRequest("GET", "/_sim/violations", nil))
	var served []Violation
	if json.Unmarshal(rec.Body.Bytes(), &served) != nil || len(served) != 2 || served[1].Code != "b" {
		t.Errorf("served %s", rec.Body)
	}
}
