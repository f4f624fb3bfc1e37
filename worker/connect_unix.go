//go:build unix

package worker

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ownFile refuses a file another user owns or may read or write.
func ownFile(info fs.FileInfo) error {
	if info.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("mode %v: others may read or change it (the sidecar writes it 0600)", info.Mode().Perm())
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("owned by uid %d, not by this user (%d)", st.Uid, os.Getuid())
	}
	return nil
}
