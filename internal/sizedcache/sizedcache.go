// Package sizedcache is a cache in memory bounded by the size of what it
// holds: each value has its own expiry, and the oldest values (those
// expired among them first) are dropped to stay under the bound. It is
// golang-lru's simplelru, read without refreshing (Peek), with a byte
// count kept by its eviction callback. golang-lru's expirable cache has one
// TTL for all values and a bound on their number only; the dedupe memo
// needs each tool's TTL, and both users need a bound in bytes.
package sizedcache

import (
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Cache maps keys to values of a size. It is not safe for concurrent
// use: its users hold a lock of their own around their steps.
type Cache[V any] struct {
	lru      *simplelru.LRU[string, item[V]]
	size     func(V) int
	maxBytes int
	bytes    int
}

type item[V any] struct {
	v       V
	expires time.Time
}

// minItemBytes is what an entry is taken to cost at least, besides its
// value: the bound on the number of entries is maxBytes over it, and never
// under minItems.
const (
	minItemBytes = 128
	minItems     = 1024
)

// New returns a cache that holds at most maxBytes, measured by size.
func New[V any](maxBytes int, size func(V) int) *Cache[V] {
	c := &Cache[V]{size: size, maxBytes: maxBytes}
	c.lru, _ = simplelru.NewLRU(max(minItems, maxBytes/minItemBytes), func(_ string, it item[V]) { c.bytes -= c.size(it.v) })
	return c
}

// Get returns the value under key, unless it has expired.
func (c *Cache[V]) Get(key string) (v V, ok bool) {
	it, ok := c.lru.Peek(key)
	if !ok || !time.Now().Before(it.expires) {
		return v, false
	}
	return it.v, true
}

// Put stores v under key until expires, as the newest value, then drops
// the oldest until the cache is under its bound, and the expired among
// the oldest. A value larger than the whole bound is not stored (false).
func (c *Cache[V]) Put(key string, v V, expires time.Time) bool {
	if c.size(v) > c.maxBytes {
		return false
	}
	c.lru.Remove(key) // a value stored again is the newest
	c.lru.Add(key, item[V]{v, expires})
	c.bytes += c.size(v)
	now := time.Now()
	for {
		_, oldest, ok := c.lru.GetOldest()
		if !ok || (c.bytes <= c.maxBytes && now.Before(oldest.expires)) {
			return true
		}
		c.lru.RemoveOldest()
	}
}

// Bytes is the size of what the cache holds.
func (c *Cache[V]) Bytes() int { return c.bytes }

// MaxBytes is the cache's bound.
func (c *Cache[V]) MaxBytes() int { return c.maxBytes }
