package config

import (
	"fmt"
	"strings"
)

// Setting is one effective value and where it came from.
type Setting struct {
	Key, Value string
	Source     string // default, file, env or flag
}

// Explain loads the configuration as Load does and lists every key with
// its effective value and its source, URLs redacted (the configuration
// holds no secret itself: those are files, or the Core key's variable,
// which is not listed). The tools are one line: `toolsidecar check` shows
// them.
func Explain(path string, overrides []string) ([]Setting, error) {
	_, ls, err := loadPath(path, overrides)
	if err != nil {
		return nil, err
	}
	k, source := ls.k, ls.source
	var out []Setting
	for _, key := range k.Keys() {
		if key == "tools" || strings.HasPrefix(key, "tools.") {
			continue
		}
		src := source[key]
		if src == "" {
			src = "default"
		}
		val := fmt.Sprint(k.Get(key))
		if strings.Contains(val, "://") {
			val = RedactURL(val)
		}
		out = append(out, Setting{Key: key, Value: val, Source: src})
	}
	tsrc := "default"
	if k.Exists("tools") && source["tools"] != "" {
		tsrc = source["tools"]
	}
	out = append(out, Setting{Key: "tools", Value: fmt.Sprintf("%d tools (toolsidecar check lists them)", len(k.Slices("tools"))), Source: tsrc})
	return out, nil
}
