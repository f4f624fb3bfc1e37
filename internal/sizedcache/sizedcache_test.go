package sizedcache

import (
	"fmt"
	"testing"
	"time"
)

func strlen(s string) int { return len(s) }

// TestBoundAndExpiry: the cache stays under its byte bound by dropping
// its oldest values; a value stored again is the newest and counted once;
// an expired value is a miss, and is dropped once it is the oldest; a
// value larger than the bound is refused.
func TestBoundAndExpiry(t *testing.T) {
	c := New(10, strlen)
	later := time.Now().Add(time.Hour)
	c.Put("a", "aaaa", later)
	c.Put("b", "bbbb", later)
	c.Put("a", "AAAA", later) // a is now newer than b
	if c.Bytes() != 8 {
		t.Fatalf("%d bytes held after storing a again, want 8", c.Bytes())
	}
	c.Put("c", "cccc", later) // 12 bytes: b, the oldest, goes
	if _, ok := c.Get("b"); ok {
		t.Error("the oldest value outlived the bound")
	}
	if v, ok := c.Get("a"); !ok || v != "AAAA" || c.Bytes() != 8 {
		t.Errorf("a = %q %v with %d bytes held, want AAAA and 8", v, ok, c.Bytes())
	}
	if c.Put("huge", "xxxxxxxxxxx", later) {
		t.Error("a value over the whole bound was stored")
	}

	d := New(100, strlen)
	d.Put("gone", "g", time.Now().Add(-time.Second))
	if _, ok := d.Get("gone"); ok {
		t.Error("an expired value was returned")
	}
	d.Put("kept", "k", later)
	if d.Bytes() != 1 {
		t.Errorf("%d bytes held, want the expired oldest dropped (1)", d.Bytes())
	}
}

// TestCountBound: many small values are bounded in number too (maxBytes
// over minItemBytes), the oldest going first.
func TestCountBound(t *testing.T) {
	const n = 2 * minItems
	c := New(n*minItemBytes, strlen)
	later := time.Now().Add(time.Hour)
	for i := range n + 5 {
		c.Put(fmt.Sprint(i), "v", later)
	}
	if _, ok := c.Get("4"); ok {
		t.Errorf("the %dth newest value was kept past the count bound of %d", n+1, n)
	}
	if _, ok := c.Get("5"); !ok || c.Bytes() != n {
		t.Errorf("the %d newest values are not all kept (%d bytes held)", n, c.Bytes())
	}
}
