package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/projectdavid/toolsidecar/registry"
)

// printTools prints the tools as Core's assistant tools array, ready for
// POST /v1/assistants.
func printTools(w io.Writer, reg *registry.Registry, withSource bool) int {
	var list any = reg.FunctionTools()
	if withSource {
		list = reg.SourcedTools()
	}
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		fmt.Fprintf(w, "toolsidecar: %v\n", err)
		return 1
	}
	fmt.Fprintln(w, string(out))
	return 0
}
