package demo

import (
	"context"
	"fmt"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/projectdavid/toolsidecar/config"
)

// envMCPServer, set, makes the process the demo's MCP server over stdio:
// the demo starts its own binary again with it (MaybeServeMCP, called
// first by main and by the tests' TestMain).
const envMCPServer = "TOOLSIDECAR_DEMO_MCP_SERVER"

// MaybeServeMCP serves the demo's MCP server on stdin and stdout and exits,
// when the demo started this process as that server.
func MaybeServeMCP() {
	if os.Getenv(envMCPServer) == "" {
		return
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "demo-fx", Version: "1"}, nil)
	type convert struct {
		Amount float64 `json:"amount" jsonschema:"the amount to convert"`
		From   string  `json:"from" jsonschema:"ISO 4217 code of the amount's currency"`
		To     string  `json:"to" jsonschema:"ISO 4217 code of the currency wanted"`
	}
	rates := map[string]float64{"USD": 1, "EUR": 0.92, "GBP": 0.79, "JPY": 151}
	mcp.AddTool(s, &mcp.Tool{Name: "convert_currency", Description: "Converts an amount between currencies at today's demo rates.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in convert) (*mcp.CallToolResult, any, error) {
			from, okFrom := rates[in.From]
			to, okTo := rates[in.To]
			if !okFrom || !okTo {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "unknown currency"}}}, nil, nil
			}
			text := fmt.Sprintf(`{"amount": %.2f, "currency": %q}`, in.Amount/from*to, in.To)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "demo MCP server:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// mcpTools is the demo's MCP server as a tools entry: this binary again,
// its tools imported from tools/list.
func mcpTools() (config.Tool, error) {
	self, err := os.Executable()
	if err != nil {
		return config.Tool{}, err
	}
	return config.Tool{Name: "fx", Route: "mcp", Settings: map[string]any{"mcp": map[string]any{
		"command": []any{self}, "env": map[string]any{envMCPServer: "1"}, "import": true}}}, nil
}
