// Package toolsidecar is the module root. It embeds the documented example
// configuration so that the demo and the tests use the very file that is
// shipped.
package toolsidecar

import _ "embed"

// ExampleConfig is config.yaml, as shipped.
//
//go:embed config.yaml
var ExampleConfig []byte
