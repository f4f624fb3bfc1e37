// Package image builds toolsidecar's container image without a container
// engine: the static binary, compiled here for each platform, on a base of
// a few files (the non-root user, the CA certificates), assembled with
// go-containerregistry into an OCI image index. Every input is pinned (the
// commit, the Go toolchain, the modules in go.sum, the commit's time for
// every timestamp), so two builds of one commit are byte-identical.
package image

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
	"sigs.k8s.io/yaml"
)

// Paths inside the image.
const (
	Binary   = "/usr/local/bin/toolsidecar"
	Config   = "/etc/toolsidecar/config.yaml"
	CABundle = "/etc/ssl/certs/ca-certificates.crt"
	// User is the non-root user and group the image runs as (the number
	// distroless calls nonroot).
	User = "65532:65532"
)

// Source is where the code comes from, for the image's labels.
const Source = "https://github.com/projectdavid/toolsidecar"

// Spec says what to build.
type Spec struct {
	// Root is the repository's root: the module of cmd/toolsidecar.
	Root string
	// Repository and Version name the image (Repository:Version).
	// default: the chart's image.repository and appVersion (Defaults).
	Repository, Version string
	// Revision is the commit, for the labels and `toolsidecar version`.
	Revision string
	// Created stamps the config, the history and every file: the commit's
	// time, so that a build is reproducible.
	Created time.Time
	// Platforms to build. default: linux/amd64 and linux/arm64.
	Platforms []v1.Platform
}

// Ref is the image's reference, Repository:Version.
func (s Spec) Ref() string { return s.Repository + ":" + s.Version }

// DefaultRepository names the image when neither the build nor the chart
// does: the chart has no default repository, since the operator pushes the
// image to a registry of theirs; this is the name a release pushes it as.
const DefaultRepository = "ghcr.io/projectdavid/toolsidecar"

// Defaults fills what spec leaves out: the version from the chart under
// root (its appVersion, the tag the chart defaults to), the repository
// from the chart's image.repository or else DefaultRepository.
func Defaults(spec Spec) (Spec, error) {
	if spec.Repository == "" || spec.Version == "" {
		repo, version, err := ChartImage(spec.Root)
		if err != nil {
			return spec, err
		}
		spec.Repository = cmp.Or(spec.Repository, repo, DefaultRepository)
		spec.Version = cmp.Or(spec.Version, version)
	}
	if len(spec.Platforms) == 0 {
		spec.Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}
	}
	return spec, nil
}

// ChartImage reads the chart's default image: values.yaml's
// image.repository (empty when it has none) and Chart.yaml's appVersion
// (the tag's default).
func ChartImage(root string) (repository, version string, err error) {
	dir := filepath.Join(root, "deploy", "helm", "toolsidecar")
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	for file, v := range map[string]any{"values.yaml": &values, "Chart.yaml": &chart} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return "", "", err
		}
		if err := yaml.Unmarshal(data, v); err != nil {
			return "", "", fmt.Errorf("%s: %w", file, err)
		}
	}
	if chart.AppVersion == "" {
		return "", "", fmt.Errorf("the chart under %s has no appVersion", dir)
	}
	return values.Image.Repository, cmp.Or(values.Image.Tag, chart.AppVersion), nil
}

// Build compiles the binary for each platform and assembles the index.
func Build(ctx context.Context, spec Spec) (v1.ImageIndex, error) {
	spec, err := Defaults(spec)
	if err != nil {
		return nil, err
	}
	base, err := baseLayer(spec.Created)
	if err != nil {
		return nil, err
	}
	config, err := os.ReadFile(filepath.Join(spec.Root, "config.yaml"))
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "toolsidecar-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range spec.Platforms {
		bin := filepath.Join(tmp, p.OS+"-"+p.Architecture)
		if err := compile(ctx, spec, p, bin); err != nil {
			return nil, err
		}
		img, err := platformImage(spec, p, base, bin, config)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", p.OS, p.Architecture, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return idx, nil
}

// compile builds the static binary as the release does: no cgo, paths
// trimmed, no VCS stamp (the version and revision are set at link time).
func compile(ctx context.Context, spec Spec, p v1.Platform, out string) error {
	ldflags := fmt.Sprintf("-s -w -X github.com/projectdavid/toolsidecar/internal/version.Version=%s -X github.com/projectdavid/toolsidecar/internal/version.Revision=%s",
		spec.Version, cmp.Or(spec.Revision, "unknown"))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, "./cmd/toolsidecar")
	cmd.Dir = spec.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture, "GOFLAGS=")
	if p.Variant != "" && p.Architecture == "arm" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build for %s/%s: %w\n%s", p.OS, p.Architecture, err, msg)
	}
	return nil
}

// platformImage is one platform's image: the base layer, then the binary
// and the default config.
func platformImage(spec Spec, p v1.Platform, base v1.Layer, bin string, config []byte) (v1.Image, error) {
	binary, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	app, err := layer(spec.Created, []file{
		{path: Binary, mode: 0o755, data: binary},
		{path: Config, mode: 0o644, data: config},
	})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config = v1.Config{
		User:       User,
		WorkingDir: "/home/nonroot",
		Entrypoint: []string{Binary},
		Cmd:        []string{"run", "--config", Config},
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=" + CABundle},
		Labels:     Labels(spec),
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	created := v1.Time{Time: spec.Created}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{Created: created, CreatedBy: "toolsidecar image: user nonroot, CA certificates"}},
		mutate.Addendum{Layer: app, MediaType: types.OCILayer, History: v1.History{Created: created, CreatedBy: "toolsidecar image: " + Binary + ", " + Config}},
	)
	if err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, created)
}

// Labels are the OCI annotations the image's config carries.
func Labels(spec Spec) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "toolsidecar",
		"org.opencontainers.image.description": "Executes the tool calls of LLM runs over NATS, a whole batch at a time",
		"org.opencontainers.image.version":     spec.Version,
		"org.opencontainers.image.revision":    cmp.Or(spec.Revision, "unknown"),
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.created":     spec.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
}

// baseLayer holds what the binary needs of an operating system: the
// non-root user, a home and /tmp, name resolution through files then DNS,
// and the CA certificates.
func baseLayer(created time.Time) (v1.Layer, error) {
	certs, err := caBundle()
	if err != nil {
		return nil, err
	}
	return layer(created, []file{
		{path: "/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{path: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{path: CABundle, mode: 0o644, data: certs},
		{path: "/home/nonroot", mode: fs.ModeDir | 0o700, uid: 65532},
		{path: "/tmp", mode: fs.ModeDir | fs.ModeSticky | 0o777},
	})
}

// caBundle is the NSS trust store as x509roots/fallback carries it (a Go
// module, pinned in go.sum, so the bundle does not depend on the machine
// that builds). A root with a constraint PEM cannot express (a distrust
// date) is left out rather than trusted without it.
func caBundle() ([]byte, error) {
	var buf bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if _, err := x509.ParseCertificate(r.Certificate); err != nil {
			return nil, fmt.Errorf("a root of the bundle does not parse: %w", err)
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// file is an entry of a layer; a directory has fs.ModeDir in its mode.
type file struct {
	path string
	mode fs.FileMode
	uid  int
	data []byte
}

// layer writes files as a tar, with their parent directories, sorted by
// path, every time set to created and every owner but uid root.
func layer(created time.Time, files []file) (v1.Layer, error) {
	entries := map[string]file{}
	for _, f := range files {
		entries[f.path] = f
		for dir := path.Dir(f.path); dir != "/"; dir = path.Dir(dir) {
			if _, ok := entries[dir]; !ok {
				entries[dir] = file{path: dir, mode: fs.ModeDir | 0o755}
			}
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range slices.Sorted(maps.Keys(entries)) {
		f := entries[p]
		h := &tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: int64(f.mode.Perm()), Uid: f.uid, Gid: f.uid,
			ModTime: created.UTC().Truncate(time.Second), Format: tar.FormatPAX}
		if f.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		if f.mode.IsDir() {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// WriteLayout writes idx as an OCI image layout in dir (replaced), its
// index annotated with the image's reference.
func WriteLayout(dir string, idx v1.ImageIndex, ref string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
}

// Platform returns idx's image for one platform.
func Platform(idx v1.ImageIndex, p v1.Platform) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.OS == p.OS && d.Platform.Architecture == p.Architecture {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("the index has no image for %s/%s", p.OS, p.Architecture)
}
