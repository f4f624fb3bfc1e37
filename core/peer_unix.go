//go:build unix

package core

import (
	"net"
	"syscall"
)

// closedByPeer reports whether an idle connection can no longer carry a
// request: its peer closed it (a read would see the end of the stream),
// or sent something unasked (an HTTP server's 408 before it closes, a
// TLS alert). It peeks without blocking and without consuming, one
// system call; net/http's Transport learns the same from a read it keeps
// pending on every idle connection, with a goroutine of its own.
func closedByPeer(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var b [1]byte
	closed := true
	err = rc.Read(func(fd uintptr) bool {
		// Go's sockets do not block: with nothing to read, EAGAIN.
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		closed = err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
		return true // one attempt, never a wait
	})
	return err != nil || closed
}
