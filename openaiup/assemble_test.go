package openaiup

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/modelapi"
)

// deltas reads tool-call fragments written as the servers send them: one
// JSON array of delta.tool_calls items per chunk.
func deltas(t *testing.T, chunks ...string) []modelapi.Call {
	t.Helper()
	var a assembler
	for _, c := range chunks {
		var ds []modelapi.CallDelta
		if err := json.Unmarshal([]byte(c), &ds); err != nil {
			t.Fatalf("chunk %s: %v", c, err)
		}
		a.add(ds)
	}
	return a.done()
}

func TestAssembleQuirks(t *testing.T) {
	cases := []struct {
		name   string
		chunks []string
		want   []string // name(args), in order
		ids    []string // "" for a made id
	}{
		{"openai: head, then fragments", []string{
			`[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":""}}]`,
			`[{"index":0,"function":{"arguments":"{\"x\":"}}]`, `[{"index":0,"function":{"arguments":"1}"}}]`,
			`[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":""}}]`, `[{"index":1,"function":{"arguments":"{}"}}]`,
		}, []string{`f({"x":1})`, `g({})`}, []string{"a", "b"}},
		{"vllm: no arguments key on the head, null later", []string{
			`[{"index":0,"id":"a","type":"function","function":{"name":"f"}}]`,
			`[{"index":0,"function":{"arguments":null}}]`, `[{"index":0,"function":{"arguments":"{\"x\":2}"}}]`,
		}, []string{`f({"x":2})`}, []string{"a"}},
		{"ollama: whole calls at index 0 in one chunk", []string{
			`[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\":1}"}},{"index":0,"id":"b","function":{"name":"f","arguments":"{\"x\":2}"}}]`,
		}, []string{`f({"x":1})`, `f({"x":2})`}, []string{"a", "b"}},
		{"ollama before ids: no index, no id", []string{
			`[{"function":{"name":"f","arguments":"{\"x\":1}"}}]`, `[{"function":{"name":"g","arguments":"{\"y\":1}"}}]`,
		}, []string{`f({"x":1})`, `g({"y":1})`}, []string{"", ""}},
		{"llama.cpp: fragments interleave", []string{
			`[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":""}}]`,
			`[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":""}}]`,
			`[{"index":0,"function":{"arguments":"{\"x\""}}]`, `[{"index":1,"function":{"arguments":"{\"y\""}}]`,
			`[{"index":0,"function":{"arguments":":1}"}}]`, `[{"index":1,"function":{"arguments":":2}"}}]`,
		}, []string{`f({"x":1})`, `g({"y":2})`}, []string{"a", "b"}},
		{"litellm: id on every fragment, then the call again whole", []string{
			`[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":""}}]`,
			`[{"index":0,"id":"a","type":"function","function":{"arguments":"{\"x\":"}}]`,
			`[{"index":0,"id":"a","type":"function","function":{"arguments":"1}"}}]`,
			`[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]`,
		}, []string{`f({"x":1})`}, []string{"a"}},
		{"a negative index is 0", []string{
			`[{"index":-1,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\""}}]`,
			`[{"index":0,"function":{"arguments":":1}"}}]`,
		}, []string{`f({"x":1})`}, []string{"a"}},
		{"the same id twice: the second is made unique", []string{
			`[{"index":0,"id":"a","function":{"name":"f","arguments":"{}"}},{"index":1,"id":"a","function":{"name":"g","arguments":"{}"}}]`,
		}, []string{`f({})`, `g({})`}, []string{"a", ""}},
		{"empty arguments are an empty object", []string{
			`[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":""}}]`,
		}, []string{`f({})`}, []string{"a"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := deltas(t, tc.chunks...)
			if len(got) != len(tc.want) {
				t.Fatalf("%d calls %+v, want %v", len(got), got, tc.want)
			}
			for i, c := range got {
				var v any
				_ = json.Unmarshal([]byte(c.Args), &v)
				norm, _ := json.Marshal(v)
				if s := c.Name + "(" + string(norm) + ")"; s != tc.want[i] || c.Problem != "" {
					t.Errorf("call %d is %s (problem %q), want %s", i, s, c.Problem, tc.want[i])
				}
				switch {
				case tc.ids[i] != "" && c.ID != tc.ids[i]:
					t.Errorf("call %d has id %q, want %q", i, c.ID, tc.ids[i])
				case tc.ids[i] == "" && (!strings.HasPrefix(c.ID, "call_") || len(c.ID) != 29 || c.ID == got[0].ID && i > 0):
					t.Errorf("call %d has id %q, want a made, unique call_ id", i, c.ID)
				}
			}
		})
	}
}

func TestAssembleProblems(t *testing.T) {
	got := deltas(t,
		`[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\":"}}]`,
		`[{"index":1,"id":"b","function":{"name":"g","arguments":"[1,2]"}}]`,
		`[{"index":2,"id":"c","function":{"arguments":"{}"}}]`)
	want := []string{"not valid JSON", "not a JSON object", "no function name"}
	for i, w := range want {
		if !strings.Contains(got[i].Problem, w) {
			t.Errorf("call %d: problem %q, want %q", i, got[i].Problem, w)
		}
	}
	if got[0].Args != `{"x":` {
		t.Errorf("arguments %q: the model's text must be kept as written, for the replay", got[0].Args)
	}
}

func TestReady(t *testing.T) {
	for args, want := range map[string]bool{`{"x":1}`: true, `{"x":1} `: true, `{"x":`: false, `{"x":"}"`: false, `[1]`: false, ``: false} {
		p := &partial{name: "f"}
		p.args.WriteString(args)
		if p.ready() != want {
			t.Errorf("ready(%q) = %v, want %v", args, !want, want)
		}
	}
}

// A turn asked for again after a cut gives the application only what it
// has not been given; once the text goes another way, all of it.
func TestUnshown(t *testing.T) {
	shown := "Hello wor"
	var rd reading
	var got []string
	for _, piece := range []string{"Hel", "lo w", "orld", "!"} {
		got = append(got, rd.unshown(piece, shown))
	}
	if strings.Join(got, "|") != "||ld|!" {
		t.Errorf("same words again: %q", got)
	}
	var other reading
	got = nil
	for _, piece := range []string{"Hel", "p me", "!"} {
		got = append(got, other.unshown(piece, shown))
	}
	if strings.Join(got, "|") != "|p me|!" {
		t.Errorf("another way: %q", got)
	}
}

// TestAssembleBound: fragments past the bound are not kept, however many
// come; the call has a Problem and replays "{}", its sibling is whole.
func TestAssembleBound(t *testing.T) {
	a := assembler{maxArgs: 64}
	add := func(c string) {
		var ds []modelapi.CallDelta
		if err := json.Unmarshal([]byte(c), &ds); err != nil {
			t.Fatal(err)
		}
		a.add(ds)
	}
	add(`[{"index":0,"id":"a","function":{"name":"f","arguments":""}},{"index":1,"id":"b","function":{"name":"g","arguments":"{}"}}]`)
	for range 1000 {
		add(`[{"index":0,"function":{"arguments":"{\"x\": \"0123456789\"}"}}]`)
	}
	got := a.done()
	if len(got) != 2 || got[0].Args != "{}" || !strings.Contains(got[0].Problem, "longer than the limit of 64") || a.calls[0].args.Len() != 0 {
		t.Errorf("the call past the bound: %+v (kept %d bytes)", got[0], a.calls[0].args.Len())
	}
	if got[1].Problem != "" || got[1].Args != "{}" {
		t.Errorf("its sibling: %+v", got[1])
	}
}

// TestOddCallIDs: an id the sidecar does not take (too long, or with
// characters outside tool.CheckCallID's) is replaced with one of its own;
// a sound one is kept.
func TestOddCallIDs(t *testing.T) {
	got := deltas(t, `[{"index":0,"id":"functions.get_weather:0","function":{"name":"f","arguments":"{}"}},`+
		`{"index":1,"id":"call with spaces\u001b","function":{"name":"g","arguments":"{}"}},`+
		`{"index":2,"id":"`+strings.Repeat("x", 65)+`","function":{"name":"h","arguments":"{}"}}]`)
	if len(got) != 3 || got[0].ID != "functions.get_weather:0" {
		t.Fatalf("calls %+v", got)
	}
	for _, c := range got[1:] {
		if !strings.HasPrefix(c.ID, "call_") || len(c.ID) != 29 {
			t.Errorf("call %s kept id %q, want a made one", c.Name, c.ID)
		}
	}
}
