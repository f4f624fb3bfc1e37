// Package syncbuf is a bytes buffer safe for concurrent writers and
// readers: a log sink that tests read while the code under test writes.
// It is for tests only, and a leaf, so that any package's tests may use it.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer collects writes.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
