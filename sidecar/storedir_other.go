//go:build !unix

package sidecar

import "io/fs"

// ownerOf: modes and owners say nothing of writers here; the folder's ACL
// does, so the store folder is not checked.
func ownerOf(fs.FileInfo) (uid int, known bool) { return 0, false }
