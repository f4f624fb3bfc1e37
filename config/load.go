package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
)

// Load reads path (may be empty: defaults only), then the environment, then
// the key=value overrides, and validates the result.
func Load(path string, overrides []string) (Config, error) {
	cfg, _, err := loadPath(path, overrides)
	return cfg, err
}

// loadPath reads path (if any) and loads it with the environment.
func loadPath(path string, overrides []string) (Config, *layers, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = readBounded(path, MaxFileBytes); err != nil {
			return Config{}, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return loadLayers(data, path, os.Environ(), overrides)
}

// MaxFileBytes bounds a configuration file: `--config /dev/zero` is an
// error, not an out-of-memory crash.
const MaxFileBytes = 1 << 20

// maxSecretBytes bounds a secret file.
const maxSecretBytes = 64 << 10

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

// Parse reads a configuration from YAML bytes, with no environment or
// overrides: for embedded configurations and tests.
func Parse(data []byte) (Config, error) {
	return load(data, "config", nil, nil)
}

// load merges the defaults, the file (data, when not nil), the environment
// and the overrides, and reports every problem at once (*Problems), each
// with its key and, for the file's keys, its line.
func load(data []byte, name string, environ, overrides []string) (Config, error) {
	cfg, _, err := loadLayers(data, name, environ, overrides)
	return cfg, err
}

// layers is the merged configuration and where each key's value came
// from: "file", "env" or "flag" (absent: the default).
type layers struct {
	k      *koanf.Koanf
	source map[string]string
}

// loadLayers is load, with the merged layers for `toolsidecar config`.
func loadLayers(data []byte, name string, environ, overrides []string) (Config, *layers, error) {
	if name == "" {
		name = "the configuration"
	}
	k := koanf.New(".")
	if err := k.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		return Config{}, nil, fmt.Errorf("config: defaults: %w", err)
	}
	known := k.Keys()
	ls := &layers{k: k, source: map[string]string{}}
	var errs []error
	var pos *lines
	if data != nil {
		var err error
		if pos, err = scanYAML(data); err != nil {
			return Config{}, nil, &Problems{Source: name, List: []error{err}}
		}
		errs = append(errs, pos.unknown...)
		fk := koanf.New(".")
		if err := fk.Load(rawbytes.Provider(data), yaml.Parser()); err != nil {
			return Config{}, nil, &Problems{Source: name, List: []error{err}}
		}
		for _, key := range fk.Keys() {
			ls.source[key] = "file"
		}
		if err := k.Merge(fk); err != nil {
			return Config{}, nil, &Problems{Source: name, List: []error{err}}
		}
	}
	errs = append(errs, ls.override(known, environ, overrides)...)
	var cfg Config
	// Unknown keys of the file were found by scanYAML, with their lines;
	// those of the environment and flags just above.
	err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{DecoderConfig: &mapstructure.DecoderConfig{
		DecodeHook:       mapstructure.ComposeDecodeHookFunc(durationWithUnit, mapstructure.StringToTimeDurationHookFunc()),
		ErrorUnused:      data == nil,
		WeaklyTypedInput: true,
		TagName:          "koanf",
	}})
	if err != nil {
		errs = append(errs, decodeErrors(err)...)
	}
	raw, _ := k.Get("tools").([]any)
	for i := range cfg.Tools {
		cfg.Tools[i].applyDefaults()
		if i < len(raw) {
			if m, ok := raw[i].(map[string]any); ok && m["retries"] != nil {
				cfg.Tools[i].defaulted = slices.DeleteFunc(cfg.Tools[i].defaulted, func(k string) bool { return k == "retries" })
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = append(errs, j.Unwrap()...)
		} else {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return Config{}, nil, &Problems{Source: name, List: tidy(blame(errs, pos, ls))}
	}
	return cfg, ls, nil
}

// override sets the keys that the environment (TOOLSIDECAR_…) and the
// --set overrides name, over the file's; a name that is no key is a
// problem, with the closest key suggested.
func (ls *layers) override(known, environ, overrides []string) []error {
	var errs []error
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || slices.Contains(otherEnv, name) {
			continue
		}
		i := slices.IndexFunc(known, func(key string) bool { return envName(key) == name })
		if i < 0 {
			names := make([]string, 0, len(known)+len(otherEnv))
			for _, key := range known {
				names = append(names, envName(key))
			}
			errs = append(errs, fmt.Errorf("environment variable %s is not a setting%s", name, didYouMean(name, append(names, otherEnv...))))
			continue
		}
		ls.k.Set(known[i], val)
		ls.source[known[i]] = "env"
	}
	for _, o := range overrides {
		key, val, ok := strings.Cut(o, "=")
		if !ok || !slices.Contains(known, key) {
			errs = append(errs, fmt.Errorf("--set %q: not a known key=value%s", o, didYouMean(key, known)))
			continue
		}
		ls.k.Set(key, val)
		ls.source[key] = "flag"
	}
	return errs
}

// decodeErrors splits the decoder's one error into one per key.
func decodeErrors(err error) []error {
	var out []error
	for line := range strings.Lines(err.Error()) {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "* "))
		if line == "" || strings.HasPrefix(line, "decoding failed") {
			continue
		}
		out = append(out, errors.New(line))
	}
	if len(out) == 0 {
		out = append(out, err)
	}
	return out
}

// durationWithUnit refuses a bare number where a duration goes: YAML's
// "timeout: 30" would otherwise mean 30 nanoseconds.
func durationWithUnit(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[time.Duration]() || from == to {
		return data, nil // a default, already a duration
	}
	switch from.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return nil, fmt.Errorf("duration %v has no unit: write it like 30s, 500ms or 2m", data)
	case reflect.String:
		if _, err := strconv.ParseFloat(data.(string), 64); err == nil {
			return nil, fmt.Errorf("duration %q has no unit: write it like 30s, 500ms or 2m", data)
		}
	}
	return data, nil
}

// otherEnv are the TOOLSIDECAR_ variables that are not configuration keys:
// the Core and upstream keys, the log flags' defaults, and the subject
// prefix that the example workers read.
var otherEnv = []string{APIKeyEnv, UpstreamAPIKeyEnv, "TOOLSIDECAR_LOG_LEVEL", "TOOLSIDECAR_LOG_FORMAT", "TOOLSIDECAR_PREFIX"}

// didYouMean suggests the closest of names to s, when one is close.
func didYouMean(s string, names []string) string {
	if best := closest(s, names); best != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return ""
}

// closest is the name nearest to s by edit distance (case aside), or ""
// when none is within about a third of s.
func closest(s string, names []string) string {
	best, bestD := "", len(s)/3+2
	for _, n := range names {
		if d := editDistance(strings.ToLower(s), strings.ToLower(n)); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func envName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}
