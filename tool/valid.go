package tool

import (
	"bytes"
	"encoding/json"
)

// validJSON reports what json.Valid reports, in one pass: json.Valid runs
// encoding/json's scanner, an indirect call per byte, which was most of the
// worker's manifest parsing (BENCHMARKS.md). Nesting deeper than its small
// stack is left to json.Valid, which also enforces encoding/json's depth
// limit. FuzzValidJSON holds the two to the same answers.
func validJSON(data []byte) bool {
	var stack [64]byte // the open containers: '{' or '['
	depth := 0
	i := 0
	for {
		// A value starts at i.
		i = skipSpace(data, i)
		if i >= len(data) {
			return false
		}
		switch c := data[i]; c {
		case '{', '[':
			i = skipSpace(data, i+1)
			if i < len(data) && data[i] == c+2 { // '}' is '{'+2, ']' is '['+2
				i++
				break
			}
			if depth == len(stack) {
				return json.Valid(data)
			}
			stack[depth] = c
			depth++
			if c == '{' {
				if i = member(data, i); i < 0 {
					return false
				}
			}
			continue
		case '"':
			i = scanString(data, i)
		case 't':
			i = literal(data, i, "true")
		case 'f':
			i = literal(data, i, "false")
		case 'n':
			i = literal(data, i, "null")
		default:
			i = scanNumber(data, i)
		}
		if i < 0 {
			return false
		}
		// A value ended at i: close the containers it ends, then go on
		// after a comma.
		for {
			i = skipSpace(data, i)
			if depth == 0 {
				return i == len(data)
			}
			if i >= len(data) {
				return false
			}
			if data[i] == stack[depth-1]+2 {
				depth--
				i++
				continue
			}
			if data[i] != ',' {
				return false
			}
			i++
			if stack[depth-1] == '{' {
				if i = member(data, skipSpace(data, i)); i < 0 {
					return false
				}
			}
			break
		}
	}
}

// member checks an object member's key and colon at i and returns the
// index after the colon, or -1.
func member(data []byte, i int) int {
	if i >= len(data) || data[i] != '"' {
		return -1
	}
	if i = scanString(data, i); i < 0 {
		return -1
	}
	i = skipSpace(data, i)
	if i >= len(data) || data[i] != ':' {
		return -1
	}
	return i + 1
}

// scanString returns the end of the string starting at i, or -1.
func scanString(data []byte, i int) int {
	for i++; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			i++
			if i >= len(data) {
				return -1
			}
			switch data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(data) {
					return -1
				}
				for _, h := range data[i+1 : i+5] {
					if !isHex(h) {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

// scanNumber returns the end of the number starting at i, or -1.
func scanNumber(data []byte, i int) int {
	if data[i] == '-' {
		i++
	}
	switch {
	case i >= len(data):
		return -1
	case data[i] == '0':
		i++
	case '1' <= data[i] && data[i] <= '9':
		i = digits(data, i+1)
	default:
		return -1
	}
	if i < len(data) && data[i] == '.' {
		if i++; i >= len(data) || !isDigit(data[i]) {
			return -1
		}
		i = digits(data, i)
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		if i++; i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= len(data) || !isDigit(data[i]) {
			return -1
		}
		i = digits(data, i)
	}
	return i
}

func digits(data []byte, i int) int {
	for i < len(data) && isDigit(data[i]) {
		i++
	}
	return i
}

func literal(data []byte, i int, word string) int {
	if !bytes.HasPrefix(data[i:], []byte(word)) {
		return -1
	}
	return i + len(word)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
