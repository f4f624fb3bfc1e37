package chunk

import (
	"slices"
	"strings"
	"testing"
)

// TestPieces: pieces of at most n bytes that join to the text, never cut
// inside a rune; a rune longer than n is a piece of its own.
func TestPieces(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want []string
	}{
		{"abcdefg", 3, []string{"abc", "def", "g"}},
		{"aé✓b", 2, []string{"a", "é", "✓", "b"}},
		{"", 4, nil},
	} {
		got := Pieces(c.s, c.n)
		if !slices.Equal(got, c.want) || strings.Join(got, "") != c.s {
			t.Errorf("Pieces(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
