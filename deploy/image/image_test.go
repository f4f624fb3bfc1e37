package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"debug/elf"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/projectdavid/toolsidecar/deploy/image"
)

// entry is a file of a layer, as the test reads it back.
type entry struct {
	hdr  *tar.Header
	data []byte
}

// contents reads every layer of img, in order, into one view of its files.
func contents(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]entry{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files["/"+strings.TrimSuffix(h.Name, "/")] = entry{h, data}
		}
		rc.Close()
	}
	return files
}

// digests lists every file of an OCI layout with its bytes.
func layoutFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		out[strings.TrimPrefix(p, dir)] = data
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestImage builds the image twice from this checkout and reads it back:
// both layouts are byte-identical; each platform's config runs the binary
// as the non-root user with the OCI labels; its layers hold the user, the
// CA certificates, the binary and the config, owned by root but the home,
// all stamped with the commit's time; and the linux binary taken from the
// layer runs and reports the version and revision it was built with.
func TestImage(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	spec := image.Spec{Root: root, Version: "v9.9.9-test", Revision: "0123456789abcdef0123456789abcdef01234567", Created: created}
	ctx := context.Background()
	var layouts [2]string
	var idx v1.ImageIndex
	for i := range layouts {
		if idx, err = image.Build(ctx, spec); err != nil {
			t.Fatal(err)
		}
		layouts[i] = filepath.Join(t.TempDir(), "layout")
		if err := image.WriteLayout(layouts[i], idx, "example.test/toolsidecar:v9.9.9-test"); err != nil {
			t.Fatal(err)
		}
	}
	first, second := layoutFiles(t, layouts[0]), layoutFiles(t, layouts[1])
	if len(first) < 8 || len(first) != len(second) {
		t.Fatalf("layouts of %d and %d files", len(first), len(second))
	}
	for name, data := range first {
		if !bytes.Equal(data, second[name]) {
			t.Errorf("%s differs between two builds of one commit", name)
		}
	}
	if !strings.Contains(string(first["/index.json"]), `"org.opencontainers.image.ref.name": "example.test/toolsidecar:v9.9.9-test"`) {
		t.Errorf("index.json does not name the image:\n%s", first["/index.json"])
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for arch, machine := range machines {
		t.Run(arch, func(t *testing.T) {
			img, err := image.Platform(idx, v1.Platform{OS: "linux", Architecture: arch})
			if err != nil {
				t.Fatal(err)
			}
			checkConfig(t, img, arch, spec)
			files := contents(t, img)
			checkFiles(t, files, created)
			bin := filepath.Join(t.TempDir(), "toolsidecar")
			if err := os.WriteFile(bin, files[image.Binary].data, 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Machine != machine {
				t.Fatalf("the %s binary is for %v", arch, f.Machine)
			}
			if arch != runtime.GOARCH {
				return
			}
			out, err := exec.Command(bin, "version").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "v9.9.9-test") || !strings.Contains(string(out), spec.Revision) {
				t.Fatalf("the binary from the layer says %q (%v), want its version and revision", out, err)
			}
		})
	}
}

func checkConfig(t *testing.T, img v1.Image, arch string, spec image.Spec) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != "linux" || cf.Architecture != arch || c.User != "65532:65532" ||
		!slices.Equal(c.Entrypoint, []string{"/usr/local/bin/toolsidecar"}) ||
		!slices.Equal(c.Cmd, []string{"run", "--config", "/etc/toolsidecar/config.yaml"}) ||
		!slices.Contains(c.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
		t.Errorf("config %+v for %s/%s", c, cf.OS, cf.Architecture)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.version":  "v9.9.9-test",
		"org.opencontainers.image.revision": spec.Revision,
		"org.opencontainers.image.source":   "https://github.com/projectdavid/toolsidecar",
		"org.opencontainers.image.created":  "2026-12-01T12:00:00Z",
	} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	if !cf.Created.Time.Equal(spec.Created) || len(cf.History) != 2 || len(cf.RootFS.DiffIDs) != 2 {
		t.Errorf("created %v, %d history entries, %d layers; want the commit's time, 2 and 2", cf.Created, len(cf.History), len(cf.RootFS.DiffIDs))
	}
}

func checkFiles(t *testing.T, files map[string]entry, created time.Time) {
	t.Helper()
	want := map[string]int64{ // path: mode
		"/etc/passwd": 0o644, "/etc/group": 0o644, "/etc/ssl/certs/ca-certificates.crt": 0o644,
		"/usr/local/bin/toolsidecar": 0o755, "/etc/toolsidecar/config.yaml": 0o644,
		"/home/nonroot": 0o700, "/tmp": 0o1777, "/usr/local/bin": 0o755,
	}
	for p, mode := range want {
		e, ok := files[p]
		if !ok {
			t.Errorf("no %s in the image", p)
			continue
		}
		if e.hdr.Mode != mode {
			t.Errorf("%s has mode %o, want %o", p, e.hdr.Mode, mode)
		}
	}
	for p, e := range files {
		owner := 0
		if p == "/home/nonroot" {
			owner = 65532
		}
		if e.hdr.Uid != owner || e.hdr.Gid != owner || !e.hdr.ModTime.Equal(created) {
			t.Errorf("%s: owner %d:%d, time %v; want %d and the commit's time", p, e.hdr.Uid, e.hdr.Gid, e.hdr.ModTime, owner)
		}
	}
	if !strings.Contains(string(files["/etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot user:\n%s", files["/etc/passwd"].data)
	}
	config, err := os.ReadFile("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(files["/etc/toolsidecar/config.yaml"].data, config) {
		t.Error("the image's config.yaml is not the repository's")
	}
	n, isrg := 0, false
	for rest := files["/etc/ssl/certs/ca-certificates.crt"].data; ; n++ {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		isrg = isrg || c.Subject.CommonName == "ISRG Root X1"
	}
	// The Mozilla store holds about 150 roots; ISRG Root X1 (Let's
	// Encrypt) is one of them.
	if n < 100 || !isrg {
		t.Errorf("%d CA certificates (ISRG Root X1 among them: %v), want the Mozilla store's", n, isrg)
	}
}
