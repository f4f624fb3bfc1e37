package executor

import (
	"testing"

	"github.com/projectdavid/toolsidecar/tool"
)

// TestFinalOutcomes: what the ledger keeps of an attempt run in the
// sidecar's process is what a later drive takes as the call's outcome: a
// success or a final failure. A cancelled attempt's effect is unknown (an
// unsafe call is then interrupted, another runs again); a retryable
// failure of a call that may run again is followed by another attempt, so
// a crash during that one must not answer with the first one's timeout.
func TestFinalOutcomes(t *testing.T) {
	ok := tool.Outcome{Sent: true, Data: []byte(`"done"`)}
	cancelled := tool.Outcome{Sent: true, Err: tool.NewError(tool.Cancelled, "the application left")}
	timeout := tool.Outcome{Sent: true, Err: tool.NewError(tool.Timeout, "deadline passed")}
	failed := tool.Outcome{Sent: true, Err: tool.NewError(tool.ToolFailed, "card declined")}
	for _, c := range []struct {
		name   string
		out    tool.Outcome
		unsafe bool
		want   bool
	}{
		{"success", ok, false, true},
		{"unsafe success", ok, true, true},
		{"cancelled", cancelled, false, false},
		{"unsafe cancelled", cancelled, true, false},
		{"timeout, may run again", timeout, false, false},
		{"unsafe timeout, never sent again", timeout, true, true},
		{"tool error", failed, false, true},
	} {
		if got := final(c.out, tool.Request{Unsafe: c.unsafe}); got != c.want {
			t.Errorf("%s: final %v, want %v", c.name, got, c.want)
		}
	}
}
