//go:build race

package plugins

// raceEnabled: the race detector is on. The test MCP server, the same
// binary, then builds a 50 MB result many times slower.
const raceEnabled = true
