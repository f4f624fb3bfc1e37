package live

import (
	"crypto/subtle"
	"net/http"
	"slices"
	"strings"

	"github.com/projectdavid/toolsidecar/executor"
)

// Access decides which runs of the board a request sees: a caller its own
// (those its credentials drove: the same executor.CallerOf), the operator
// every one. A run of no caller (an MCP client's call) is the sidecar's
// own: shown to a request that presents the API token alone, or, without
// one, no credential at all.
type Access struct {
	// Operator is the operator's token (server.operator_token_file): a
	// request that presents it as a bearer token sees the whole board.
	// "": nobody does.
	Operator string
	// Token is the sidecar's API token (server.auth_token_file), or "".
	Token string
}

// viewer is what one request may see.
type viewer struct {
	all bool
	// callers are executor.CallerOf of its credentials, and of each of
	// its Authorization and X-Api-Key alone: a hosted session's owner is
	// the one credential its API checks (agentsup), and a request could
	// present either alone anyway.
	callers []string
	own     bool // its credentials are the sidecar's own: it sees the runs of no caller
}

// IsOperator reports a request that presents the operator's token.
func (a Access) IsOperator(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return a.Operator != "" && ok && subtle.ConstantTimeCompare([]byte(got), []byte(a.Operator)) == 1
}

func (a Access) viewer(r *http.Request) viewer {
	if a.IsOperator(r) {
		return viewer{all: true}
	}
	own := http.Header{}
	if a.Token != "" {
		own.Set("Authorization", "Bearer "+a.Token)
	}
	caller := executor.CallerOf(r.Header)
	callers := []string{caller}
	for _, name := range []string{"Authorization", "X-Api-Key"} {
		if v := r.Header.Get(name); v != "" {
			callers = append(callers, executor.CallerOf(http.Header{name: {v}}))
		}
	}
	return viewer{callers: callers, own: caller == executor.CallerOf(own)}
}

// Owns reports whether the request may see, and decide, what owner's
// drive began: a run of the board, an approval (approval.Request.Owner).
func (a Access) Owns(r *http.Request, owner string) bool { return a.viewer(r).owns(owner) }

// owns reports what owner's drive began that the viewer may see.
func (v viewer) owns(owner string) bool {
	return v.all || (owner == "" && v.own) || (owner != "" && slices.Contains(v.callers, owner))
}

// sees reports a run the viewer may see.
func (v viewer) sees(r *Run) bool { return v.owns(r.owner) }

// runs keeps the runs the viewer sees.
func (v viewer) runs(runs []Run) []Run {
	out := runs[:0]
	for i := range runs {
		if v.sees(&runs[i]) {
			out = append(out, runs[i])
		}
	}
	return out
}
