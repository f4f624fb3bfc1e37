package toolsidecar_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxREADMEBytes bounds README.md: the way in and the five-minute path,
// the details in docs/.
const maxREADMEBytes = 15 << 10

// TestREADMESize: README.md stays short enough to read first.
func TestREADMESize(t *testing.T) {
	info, err := os.Stat("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if info.Size() > maxREADMEBytes {
		t.Errorf("README.md is %d bytes, more than %d: move details to docs/", info.Size(), maxREADMEBytes)
	}
}

var (
	// mdLink is an inline link or image: [text](target) or ![alt](target).
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// codeSpan is an inline code span; one that begins "../" names a path.
	codeSpan = regexp.MustCompile("`(\\.\\./[^`\\s]*)`")
	fence    = regexp.MustCompile("^\\s*(```|~~~)")
	// scheme is a URL's scheme: such a target is not a file of the
	// repository.
	scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// TestDocLinksInRepository: every relative link of the repository's
// markdown (README.md, docs/, the libraries' READMEs…) names a file or
// folder of the repository, and its #fragment, in a markdown file, one of
// that file's headings; no path in a code span leads out of the
// repository (as ../shared/… did: a file only the authors' machine has).
func TestDocLinksInRepository(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "*.md").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err) // a source tree without git
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	files := strings.Fields(string(out))
	if len(files) < 10 {
		t.Fatalf("%d markdown files: %v", len(files), files)
	}
	anchors := map[string]map[string]bool{} // by file, of its headings
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for i, line := range strings.Split(string(data), "\n") {
			if fence.MatchString(line) {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			var targets []string
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if scheme.MatchString(target) {
					continue
				}
				if err := resolves(root, file, target, anchors); err != "" {
					t.Errorf("%s:%d: %s: %s", file, i+1, target, err)
				}
			}
		}
	}
}

// resolves says what is wrong with target, a relative link of file; ""
// when it names a file of the repository (and one of its headings).
func resolves(root, file, target string, anchors map[string]map[string]bool) string {
	path, frag, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		dest = filepath.Join(filepath.Dir(file), path)
	}
	abs, err := filepath.Abs(dest)
	if err != nil {
		return err.Error()
	}
	if rel, err := filepath.Rel(root, abs); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "outside the repository"
	}
	if _, err := os.Stat(dest); err != nil {
		return "no such file in the repository"
	}
	if frag == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	if anchors[dest] == nil {
		data, err := os.ReadFile(dest)
		if err != nil {
			return err.Error()
		}
		anchors[dest] = headingAnchors(string(data))
	}
	if !anchors[dest][frag] {
		return "no heading #" + frag + " in " + dest
	}
	return ""
}

var notInAnchor = regexp.MustCompile(`[^\p{L}\p{N}\s_-]`)

// headingAnchors are the fragments GitHub gives a markdown file's
// headings: lowercased, punctuation dropped, spaces made hyphens.
func headingAnchors(md string) map[string]bool {
	anchors := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(md, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		slug := strings.ReplaceAll(notInAnchor.ReplaceAllString(strings.ToLower(text), ""), " ", "-")
		anchors[slug] = true
	}
	return anchors
}
