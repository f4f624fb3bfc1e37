//go:build !unix

package core

import "net"

// closedByPeer cannot peek at a connection on this system: an idle
// connection is taken as open, and a request on one that Core closed
// fails as errClosedKept (and is retried if it is safe to repeat).
func closedByPeer(net.Conn) bool { return false }
