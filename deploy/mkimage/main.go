// Command mkimage builds toolsidecar's container image without a container
// engine (package image) and writes it as an OCI image layout; with
// -docker-tar, also one platform's image as a tarball for `docker load`.
//
//	cd deploy && go run ./mkimage -out ../bin/image
//
// The version and repository default to the chart's, the revision and the
// time of every file to the commit's (git), or SOURCE_DATE_EPOCH when set.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/projectdavid/toolsidecar/deploy/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		spec      image.Spec
		out       string
		dockerTar string
		platforms string
	)
	flag.StringVar(&spec.Root, "root", "..", "the repository's root")
	flag.StringVar(&out, "out", "../bin/image", "the OCI image layout to write (replaced)")
	flag.StringVar(&dockerTar, "docker-tar", "", "also write the linux/amd64 image here, for docker load")
	flag.StringVar(&spec.Repository, "repository", "", "the image's repository (default: the chart's image.repository)")
	flag.StringVar(&spec.Version, "version", "", "the image's version and tag (default: the chart's appVersion)")
	flag.StringVar(&spec.Revision, "revision", "", "the commit (default: git rev-parse HEAD)")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "the platforms to build, comma-separated")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	for _, p := range strings.Split(platforms, ",") {
		pl, err := v1.ParsePlatform(strings.TrimSpace(p))
		if err != nil {
			return fmt.Errorf("-platforms: %w", err)
		}
		spec.Platforms = append(spec.Platforms, *pl)
	}
	var err error
	if spec.Revision == "" {
		if spec.Revision, err = git(ctx, spec.Root, "rev-parse", "HEAD"); err != nil {
			return err
		}
	}
	if spec.Created, err = created(ctx, spec.Root); err != nil {
		return err
	}
	if spec, err = image.Defaults(spec); err != nil {
		return err
	}
	idx, err := image.Build(ctx, spec)
	if err != nil {
		return err
	}
	if err := image.WriteLayout(out, idx, spec.Ref()); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s in %s\n", spec.Ref(), digest, out)
	if dockerTar == "" {
		return nil
	}
	img, err := image.Platform(idx, v1.Platform{OS: "linux", Architecture: "amd64"})
	if err != nil {
		return err
	}
	tag, err := name.NewTag(spec.Ref())
	if err != nil {
		return err
	}
	if err := tarball.WriteToFile(dockerTar, tag, img); err != nil {
		return err
	}
	fmt.Printf("linux/amd64 for docker load in %s\n", dockerTar)
	return nil
}

// created is SOURCE_DATE_EPOCH, or the commit's time.
func created(ctx context.Context, root string) (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		var err error
		if s, err = git(ctx, root, "log", "-1", "--format=%ct"); err != nil {
			return time.Time{}, err
		}
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q is not a number of seconds", s)
	}
	return time.Unix(sec, 0).UTC(), nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w (set -revision and SOURCE_DATE_EPOCH outside a git checkout)", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
