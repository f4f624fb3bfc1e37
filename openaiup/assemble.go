package openaiup

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/projectdavid/toolsidecar/modelapi"
	"github.com/projectdavid/toolsidecar/tool"
)

// assembler rebuilds a turn's tool calls from their streamed fragments.
// It follows the official SDKs (fragments keyed by index, arguments
// concatenated) and adds the rules the compatible servers need
// (../shared/reference/openai-upstream.md §1.4–1.5):
//   - a new id at an index that holds a call opens a new call (Ollama
//     sends every call whole at index 0);
//   - a whole call again at an index that holds that call (same id or
//     none, same name, same arguments) is a repeat and is dropped
//     (LiteLLM's summary chunk, a server that repeats the call after its
//     fragments); another whole call there opens a new call;
//   - a missing or negative index is 0, as openai-go clamps it;
//   - chunk ids are not looked at: some servers change them every chunk.
//
// Calls keep the order in which they began. Ids are made for calls
// without one, and for a second call with an id already used.
type assembler struct {
	calls   []*partial
	at      map[int]*partial // the call each index feeds now
	maxArgs int              // a call's arguments past it are not kept; 0: no bound
}

type partial struct {
	id, name string
	args     strings.Builder
	// lost says why the arguments were not kept: they grew past the
	// bound of the stream (the executor's own, lower, bound on arguments
	// is applied to those that were kept, which the next turn replays).
	lost string
}

// ready reports a call that can be handed over before its turn ends: it
// has a name, and its arguments are a whole JSON object (a fragment more
// would break them). The check is made only when they end in "}".
func (p *partial) ready() bool {
	if p.name == "" || p.args.Len() == 0 || p.lost != "" {
		return false
	}
	args := strings.TrimRight(p.args.String(), " \t\r\n")
	return strings.HasSuffix(args, "}") && strings.HasPrefix(strings.TrimSpace(args), "{") && json.Valid([]byte(args))
}

// whole reports whether the arguments so far are a complete JSON value:
// a fragment more would break them.
func (p *partial) whole() bool { return p.args.Len() > 0 && json.Valid([]byte(p.args.String())) }

// add takes one chunk's tool-call fragments, in order.
func (a *assembler) add(ds []modelapi.CallDelta) {
	if a.at == nil {
		a.at = map[int]*partial{}
	}
	for _, d := range ds {
		i := 0
		if d.Index != nil && *d.Index > 0 {
			i = *d.Index
		}
		args := ""
		if d.Function.Arguments != nil {
			args = *d.Function.Arguments
		}
		cur := a.at[i]
		switch {
		case cur == nil:
			cur = a.open(i)
		case d.ID != "" && cur.id != "" && d.ID != cur.id:
			cur = a.open(i)
		case d.Function.Name != "" && cur.name != "" && cur.whole():
			if (d.ID == "" || d.ID == cur.id) && d.Function.Name == cur.name && sameJSON(args, cur.args.String()) {
				continue // the call again, whole
			}
			cur = a.open(i)
		}
		if cur.id == "" {
			cur.id = d.ID
		}
		if cur.name == "" {
			cur.name = d.Function.Name
		}
		if d.Whole && cur.lost == "" {
			cur.args.Reset()
		}
		switch {
		case cur.lost != "":
		case a.maxArgs > 0 && cur.args.Len()+len(args) > a.maxArgs:
			cur.lost = fmt.Sprintf("the arguments are longer than the limit of %d bytes", a.maxArgs)
			cur.args.Reset() // not kept: the model reads that they were too long
		default:
			cur.args.WriteString(args)
		}
	}
}

// usableID reports whether the server's id of a call may be kept: the
// Responses API's bound on a call_id (64) and the characters the sidecar
// takes in one (tool.CheckCallID). Another is replaced with one of the
// sidecar's, used from then on (openai-upstream.md, "id missing").
func usableID(id string) bool { return id != "" && len(id) <= 64 && tool.CheckCallID(id) == nil }

func (a *assembler) open(i int) *partial {
	p := &partial{}
	a.calls = append(a.calls, p)
	a.at[i] = p
	return p
}

// done returns the turn's calls, one per partial call, in order.
func (a *assembler) done() []modelapi.Call {
	out := make([]modelapi.Call, 0, len(a.calls))
	seen := map[string]bool{}
	for _, p := range a.calls {
		if !usableID(p.id) || seen[p.id] {
			p.id = newCallID()
		}
		seen[p.id] = true
		out = append(out, assemble(p))
	}
	return out
}

// assemble is p as a whole call, with the reason it cannot be run, if any.
func assemble(p *partial) modelapi.Call {
	c := modelapi.Call{ID: p.id, Name: p.name, Args: p.args.String()}
	if strings.TrimSpace(c.Args) == "" {
		c.Args = "{}" // a tool without parameters (openai-python PR #3502)
	}
	switch {
	case p.lost != "":
		c.Args, c.Problem = "{}", p.lost
	case c.Name == "":
		c.Problem = "the call has no function name"
	case !json.Valid([]byte(c.Args)):
		c.Problem = fmt.Sprintf("the arguments are not valid JSON: %.200q", c.Args)
	case !bytes.HasPrefix(bytes.TrimSpace([]byte(c.Args)), []byte("{")):
		c.Problem = fmt.Sprintf("the arguments are not a JSON object: %.200q", c.Args)
	}
	return c
}

// sameJSON reports two JSON texts equal as values (or as text, where one
// is not JSON).
func sameJSON(a, b string) bool {
	if a == b {
		return true
	}
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// newCallID makes a call id: "call_" and 24 random characters, within the
// 64 characters that the Responses API allows a call_id.
func newCallID() string { return "call_" + randomToken(24) }

const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
