//go:build unix

package sidecar

import (
	"io/fs"
	"syscall"
)

// ownerOf is the uid that owns the file.
func ownerOf(info fs.FileInfo) (uid int, known bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
