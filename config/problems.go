package config

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// FieldError is one problem with one key of the configuration, with the
// line of the file where the key is, when it comes from a file.
type FieldError struct {
	Key  string // dotted path as in the file: tools[0].name
	Line int    // 0 when the value is not from the file
	Msg  string
	// Origin names where a value that is not the file's came from: the
	// environment variable (TOOLSIDECAR_SERVER_LISTEN) or the flag
	// (--set server.listen).
	Origin string

	decode bool // the value could not be decoded at all
}

func (e *FieldError) Error() string {
	if e.Origin != "" {
		return e.Origin + ": " + e.Msg
	}
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s: %s", e.Line, e.Key, e.Msg)
	}
	return e.Key + ": " + e.Msg
}

// Is makes every FieldError an ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// Problems is every problem found in a configuration, reported at once.
type Problems struct {
	Source string // the file, or "configuration"
	List   []error
}

func (p *Problems) Error() string {
	var b strings.Builder
	n := len(p.List)
	fmt.Fprintf(&b, "%s: %s has %d problem", ErrInvalid, p.Source, n)
	if n > 1 {
		b.WriteString("s")
	}
	for _, e := range p.List {
		b.WriteString("\n  " + e.Error())
	}
	return b.String()
}

// Is makes Problems an ErrInvalid; Unwrap gives each problem.
func (p *Problems) Is(target error) bool { return target == ErrInvalid }
func (p *Problems) Unwrap() []error      { return p.List }

// lines maps each key path of a YAML document to its line, and lists the
// keys the Config type does not have, with a suggestion for each.
type lines struct {
	at      map[string]int
	unknown []error
}

// scanYAML reads the document's structure against the Config type.
func scanYAML(data []byte) (*lines, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	l := &lines{at: map[string]int{}}
	if len(doc.Content) > 0 {
		l.walk("", doc.Content[0], reflect.TypeFor[Config]())
	}
	return l, nil
}

func (l *lines) walk(path string, n *yaml.Node, t reflect.Type) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			if tag := t.Field(i).Tag.Get("koanf"); tag != "" && tag != "-" {
				fields[strings.Split(tag, ",")[0]] = t.Field(i).Type
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := join(path, k.Value)
			l.at[key] = k.Line
			ft, ok := fields[k.Value]
			if !ok {
				if t == reflect.TypeFor[Tool]() {
					continue // route settings (exec:, http:) are checked by the route kind
				}
				l.unknown = append(l.unknown, &FieldError{Key: key, Line: k.Line, Msg: "unknown key" + suggestIn(path, k.Value, fields)})
				continue
			}
			l.walk(key, v, ft)
		}
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for i, item := range n.Content {
			key := fmt.Sprintf("%s[%d]", path, i)
			l.at[key] = item.Line
			l.walk(key, item, t.Elem())
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// line is the line of key, or of its closest enclosing key in the file.
func (l *lines) line(key string) int {
	for key != "" {
		if n, ok := l.at[key]; ok {
			return n
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// decodeField finds the key a decoder error names ('core.timeout'
// expected ...).
var decodeField = regexp.MustCompile(`'([A-Za-z0-9_.\[\]]+)'`)

// blame gives each problem its source: the line of the file, or the
// environment variable or flag that set the key (a value the file did not
// give is not blamed on the file's nearest line). A value that could not
// be decoded is said in the user's terms, with the value.
func blame(errs []error, pos *lines, ls *layers) []error {
	out := make([]error, 0, len(errs))
	for _, err := range errs {
		var fe *FieldError
		if !errors.As(err, &fe) {
			m := decodeField.FindStringSubmatch(err.Error())
			if m == nil {
				out = append(out, err)
				continue
			}
			msg := strings.TrimPrefix(err.Error(), "'"+m[1]+"' ")
			fe = &FieldError{Key: m[1], Msg: plainDecode(msg, ls.k.Get(m[1])), decode: true}
			err = fe
		}
		switch ls.source[fe.Key] {
		case "env":
			fe.Origin, fe.Line = envName(fe.Key), 0
		case "flag":
			fe.Origin, fe.Line = "--set "+fe.Key, 0
		default:
			if fe.Line == 0 && pos != nil {
				fe.Line = pos.line(fe.Key)
			}
		}
		out = append(out, err)
	}
	return out
}

// plainDecode says a decoder's complaint (strconv's, time's,
// mapstructure's) as the configuration's reader would: what the key takes,
// and the value it got.
func plainDecode(msg string, value any) string {
	got := ""
	if value != nil {
		got = fmt.Sprintf(", got %q", fmt.Sprint(value))
	}
	switch {
	case strings.Contains(msg, "value out of range"):
		return "is out of range" + got
	case strings.Contains(msg, "as 'int") || strings.Contains(msg, "as 'uint") || strings.Contains(msg, "expected type 'int"):
		return "must be a whole number" + got
	case strings.Contains(msg, "as 'float") || strings.Contains(msg, "expected type 'float"):
		return "must be a number" + got
	case strings.Contains(msg, "as 'bool'") || strings.Contains(msg, "expected type 'bool'"):
		return "must be true or false" + got
	case strings.HasPrefix(msg, "time: invalid duration") || strings.HasPrefix(msg, "time: unknown unit"):
		return "must be a duration like 30s, 500ms or 2m" + got
	case strings.Contains(msg, "expected a map") || strings.Contains(msg, "expected type 'map"):
		return "must be a mapping (key: value)" + got
	case strings.Contains(msg, "source data must be an array or slice"):
		return "must be a list" + got
	}
	return msg
}

// suggestIn suggests the key under path closest to leaf, as a full path.
func suggestIn(path, leaf string, fields map[string]reflect.Type) string {
	if best := closest(leaf, slices.Sorted(maps.Keys(fields))); best != "" {
		return fmt.Sprintf(" (did you mean %s?)", join(path, best))
	}
	return ""
}

// tidy orders the problems by line (those without a line last) and drops
// a check's complaint about a key whose value could not even be decoded
// (it would only repeat the decoding error).
func tidy(errs []error) []error {
	undecoded := map[string]bool{}
	for _, err := range errs {
		if fe, ok := err.(*FieldError); ok && fe.decode {
			undecoded[fe.Key] = true
		}
	}
	out := errs[:0]
	for _, err := range errs {
		if fe, ok := err.(*FieldError); ok && !fe.decode && undecoded[fe.Key] {
			continue
		}
		out = append(out, err)
	}
	lineOf := func(err error) int {
		if fe, ok := err.(*FieldError); ok && fe.Line > 0 {
			return fe.Line
		}
		return 1 << 30
	}
	slices.SortStableFunc(out, func(a, b error) int { return lineOf(a) - lineOf(b) })
	return out
}
