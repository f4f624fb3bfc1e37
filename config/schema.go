package config

import (
	"reflect"
	"strings"
	"time"
)

// durationPattern is a Go duration with units (30s, 1m30s, 500ms): a bare
// number is refused, as the loader refuses it.
const durationPattern = `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`

// enums are the keys (by name) whose values are a fixed list.
var enums = map[string][]string{
	"side_effects":  {ReadOnly, Idempotent, Unsafe},
	"missing_tool":  {MissingToolError, MissingToolFailRun},
	"kind":          UpstreamKinds,
	"approval":      {ApprovalRequired},
	"on_timeout":    {OnTimeoutDeny},
	"confirmations": {ConfirmByApplication, ConfirmByApproval},
	"sync":          {SyncAlways, SyncPeriodic},
}

// JSONSchema describes config.yaml (JSON Schema 2020-12) for editors. It
// is derived from the Config type, so it names exactly the keys the
// loader accepts; config.schema.json at the repository's root is its
// output, checked by a test (go test ./config -run Schema -update
// rewrites it).
func JSONSchema() map[string]any {
	s := schemaOf(reflect.TypeFor[Config](), "", reflect.ValueOf(Default()))
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["$id"] = "https://github.com/projectdavid/toolsidecar/config.schema.json"
	s["title"] = "toolsidecar configuration (config.yaml)"
	return s
}

// schemaOf is the schema of a value of type t under key name, with the
// field documentation (descriptions.go) and def's values as defaults.
func schemaOf(t reflect.Type, name string, def reflect.Value) map[string]any {
	s := typeSchema(t, name, def)
	if def.IsValid() && t.Kind() != reflect.Struct && t.Kind() != reflect.Slice && t.Kind() != reflect.Map &&
		(!def.IsZero() || t.Kind() == reflect.Bool) {
		if d, ok := def.Interface().(time.Duration); ok {
			s["default"] = d.String()
		} else {
			s["default"] = def.Interface()
		}
	}
	return s
}

func typeSchema(t reflect.Type, name string, def reflect.Value) map[string]any {
	if t == reflect.TypeFor[time.Duration]() {
		return map[string]any{"type": "string", "pattern": durationPattern}
	}
	switch t.Kind() {
	case reflect.Struct:
		props := map[string]any{}
		var extra any = false
		for i := range t.NumField() {
			tag := t.Field(i).Tag.Get("koanf")
			key := strings.Split(tag, ",")[0]
			switch {
			case strings.Contains(tag, "remain"):
				// A tool's route settings: a mapping under the route's name.
				extra = map[string]any{"type": "object"}
			case key != "" && key != "-":
				var fd reflect.Value
				if def.IsValid() {
					fd = def.Field(i)
				}
				p := schemaOf(t.Field(i).Type, key, fd)
				if d := descriptions[t.Name()+"."+t.Field(i).Name]; d != "" {
					p["description"] = d
				}
				props[key] = p
			}
		}
		return map[string]any{"type": "object", "properties": props, "additionalProperties": extra}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem(), "", reflect.Value{})}
	case reflect.Map:
		return map[string]any{"type": "object"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		if e, ok := enums[name]; ok {
			return map[string]any{"type": "string", "enum": e}
		}
		return map[string]any{"type": "string"}
	}
	return map[string]any{}
}
