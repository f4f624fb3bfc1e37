// Package chunk cuts text the way the simulators stream it.
package chunk

import "unicode/utf8"

// Pieces cuts s into pieces of n bytes at most, never inside a UTF-8
// sequence (a rune longer than n is one piece).
func Pieces(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		k := min(n, len(s))
		for k < len(s) && k > 0 && s[k]&0xC0 == 0x80 {
			k--
		}
		if k == 0 { // a rune longer than n
			_, k = utf8.DecodeRuneInString(s)
		}
		out = append(out, s[:k])
		s = s[k:]
	}
	return out
}
