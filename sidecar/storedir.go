package sidecar

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
)

// The embedded server's store folder holds the issued worker credentials
// and JetStream's files (the ledger, the captured replies). Whoever may
// write into it may move them: read the password a restarted sidecar
// reuses, put a ledger of their own in place. So:
//
//   - The default folder, <temp dir>/toolsidecar-nats-<port>, is in a
//     folder every local user writes to, under a name anyone can guess. It
//     is created 0700 by the sidecar, and refused when it is there already
//     and is a symbolic link, or is another user's, or others may write
//     into it: another user made it first.
//   - A configured store_dir is the operator's choice, and often a volume
//     whose owner and mode the platform sets (a Kubernetes emptyDir is
//     root's and 0777; an fsGroup makes a volume group-writable). It is
//     refused when another user than this one or root owns it, or when it
//     is this user's and every user may write into it (a mistake, which
//     chmod o-w mends). A root-owned folder that every user may write to
//     is let through with a warning: a pod's volume is written only by
//     the containers that mount it.
//
// Unix only: elsewhere a folder's ACL, not its mode, says who writes.

// privateStoreDir creates the default store folder 0700, or checks that
// the one already there is this user's alone.
func privateStoreDir(path string) error {
	err := os.Mkdir(path, 0o700)
	if err == nil || !errors.Is(err, fs.ErrExist) {
		return storeDirError(path, err)
	}
	info, err := os.Lstat(path)
	if err != nil {
		return storeDirError(path, err)
	}
	uid, known := ownerOf(info)
	refused := func(why string) error {
		owner := ""
		if known {
			owner = fmt.Sprintf(" (owner uid %d; this user is uid %d)", uid, os.Getuid())
		}
		return fmt.Errorf("sidecar: the store folder %s%s, the default of nats.embedded.store_dir, %s; remove it (as its owner or root) and start again, "+
			"or set nats.embedded.store_dir to a folder of this user's", path, owner, why)
	}
	switch {
	case info.Mode()&fs.ModeSymlink != 0:
		return refused("is a symbolic link, which another user may have made to have the worker credentials and JetStream's files written where they choose")
	case !known:
		return nil
	case !info.IsDir():
		return refused("is not a folder")
	case uid != os.Getuid():
		return refused("is another user's, who can move the worker credentials and JetStream's files")
	case info.Mode().Perm()&0o022 != 0:
		return refused(fmt.Sprintf("has mode %04o: other users may write into it, and may have already", info.Mode().Perm()))
	}
	return nil
}

// checkStoreDir checks a configured store folder, when it is there
// already: the server creates it 0700 when it is not.
func checkStoreDir(path string, log *slog.Logger) error {
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return storeDirError(path, err)
	}
	uid, known := ownerOf(info)
	switch {
	case !known:
		return nil
	case !info.IsDir():
		return fmt.Errorf("sidecar: nats.embedded.store_dir %s is not a folder", path)
	case uid != os.Getuid() && uid != 0:
		return fmt.Errorf("sidecar: nats.embedded.store_dir %s is owned by uid %d, neither this user (uid %d) nor root: that user can move the worker credentials and JetStream's files; give it to this user (chown), or choose a folder of this user's",
			path, uid, os.Getuid())
	case info.Mode().Perm()&0o002 != 0 && uid != 0:
		return fmt.Errorf("sidecar: nats.embedded.store_dir %s has mode %04o: every user may write into it; take that away (chmod o-w) or choose another folder",
			path, info.Mode().Perm())
	case info.Mode().Perm()&0o002 != 0:
		log.Warn("nats.embedded.store_dir is root's and every user may write into it: fine for a volume only this container mounts (a Kubernetes emptyDir), not on a shared host",
			"store_dir", path, "mode", fmt.Sprintf("%04o", info.Mode().Perm()))
	}
	return nil
}

func storeDirError(path string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sidecar: the store folder %s: %w", path, err)
}
