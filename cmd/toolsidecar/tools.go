package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/tool"
)

// fromDaemon reads the tools in force from the running daemon that cfg
// configures (GET /v1/tools?source=1): with the embedded NATS server,
// only the daemon sees the tools workers declare in their code. ok is
// false, and stderr says why, when no daemon answers.
func fromDaemon(ctx context.Context, cfg config.Config, stderr io.Writer) (list []tool.SourcedTool, ok bool) {
	rc, err := daemonOf(cfg, 2*time.Second)
	if err == nil {
		err = rc.get(ctx, "/v1/tools?source=1", &list)
	}
	if err != nil {
		fmt.Fprintf(stderr, "toolsidecar tools: the configuration's tools only; the tools workers declare in their code come from the running daemon: %v\n", err)
		return nil, false
	}
	return list, true
}

// printTools prints the tools as Core's assistant tools array, ready for
// POST /v1/assistants.
func printTools(w io.Writer, sourced []tool.SourcedTool, withSource bool) int {
	var list any = sourced
	if !withSource {
		fts := make([]tool.FunctionTool, len(sourced))
		for i, st := range sourced {
			fts[i] = st.FunctionTool
		}
		list = fts
	}
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		fmt.Fprintf(w, "toolsidecar: %v\n", err)
		return 1
	}
	fmt.Fprintln(w, string(out))
	return 0
}
