package approval_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/testkit/approvaltest"
)

func TestMemory(t *testing.T) {
	approvaltest.Run(t, func(*testing.T) approval.Store { return approval.NewMemory() })
}

// TestArguments: arguments are shown as they are when short and valid, and
// as the start of their text otherwise, never longer than the bound.
func TestArguments(t *testing.T) {
	if got := approval.Arguments([]byte(`{"a":1}`)); string(got) != `{"a":1}` {
		t.Errorf("short arguments became %s", got)
	}
	long := []byte(`{"a":"` + strings.Repeat("x", 2*approval.MaxArgumentsBytes) + `"}`)
	got := approval.Arguments(long)
	var s string
	if err := json.Unmarshal(got, &s); err != nil || !strings.HasPrefix(s, `{"a":"xxx`) || !strings.HasSuffix(s, "…") ||
		len(s) > approval.MaxArgumentsBytes+len("…") {
		t.Errorf("long arguments became %d bytes (%v)", len(got), err)
	}
	if got := approval.Arguments([]byte(`{"a":`)); string(got) != `"{\"a\":…"` {
		t.Errorf("broken arguments became %s", got)
	}
}
