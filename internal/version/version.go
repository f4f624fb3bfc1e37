// Package version says which build of toolsidecar is running: the module
// version and VCS revision that the Go toolchain stamps into the binary
// (debug.ReadBuildInfo), or a version set at link time for release images:
//
//	go build -ldflags "-X github.com/projectdavid/toolsidecar/internal/version.Version=v1.2.3"
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version and Revision, when set at link time, override what the
// toolchain stamped (an image build has no .git to stamp from).
var (
	Version  = ""
	Revision = ""
)

// Info describes the build.
type Info struct {
	Version   string // the module version, "(devel)" for a source build
	Revision  string // VCS revision, "unknown" when not stamped
	Time      string // VCS commit time
	Modified  bool   // the working tree had local changes
	GoVersion string
}

// Get reads the build information.
func Get() Info {
	in := Info{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			in.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Revision = s.Value
			case "vcs.time":
				in.Time = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if Version != "" {
		in.Version = Version
	}
	if Revision != "" {
		in.Revision = Revision
	}
	return in
}

// Module is the version the build carries for module path, the main
// module or a dependency (a worker binary that imports toolsidecar), or ""
// when it carries none ("(devel)" for a source build of the main module).
func Module(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if bi.Main.Path == path {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			return d.Version
		}
	}
	return ""
}

// String is the one-line form: "toolsidecar v1.2.3 (rev abc123, go1.26.8)".
func (in Info) String() string {
	rev := in.Revision
	if in.Modified {
		rev += "+modified"
	}
	if in.Time != "" {
		rev += " " + in.Time
	}
	return fmt.Sprintf("toolsidecar %s (revision %s, %s)", in.Version, rev, in.GoVersion)
}
