package charttest

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// daemon builds the toolsidecar binary of this checkout, once.
func daemon(t *testing.T) string {
	t.Helper()
	daemonOnce.Do(func() {
		dir, err := os.MkdirTemp("", "charttest-daemon")
		if err != nil {
			daemonErr = err
			return
		}
		daemonBin = filepath.Join(dir, "toolsidecar")
		if out, err := exec.Command("go", "build", "-C", "../..", "-o", daemonBin, "./cmd/toolsidecar").CombinedOutput(); err != nil {
			daemonErr = err
			daemonBin = string(out)
		}
	})
	if daemonErr != nil {
		t.Fatalf("building toolsidecar: %v\n%s", daemonErr, daemonBin)
	}
	return daemonBin
}

var (
	daemonOnce sync.Once
	daemonBin  string
	daemonErr  error
)

// explain runs `toolsidecar config` on a configuration (none: the
// defaults) and returns each key's source (default, file, env, flag).
func explain(t *testing.T, configYAML string) map[string]string {
	t.Helper()
	args := []string{"config"}
	if configYAML != "" {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(configYAML), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	cmd := exec.Command(daemon(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()} // no TOOLSIDECAR_* of the caller's
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("toolsidecar config: %v\n%s\nof:\n%s", err, out, configYAML)
	}
	sources := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		f := strings.Fields(line)
		sources[f[0]] = f[len(f)-1]
	}
	return sources
}

// leftAlone reads the chart README's table of the configuration keys the
// chart renders no value for, each with its reason.
func leftAlone(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(chart, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([a-z0-9_.]+)` \\| (.+) \\|$")
	keys, in := map[string]string{}, false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Configuration keys the chart leaves alone"
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			keys[m[1]] = m[2]
		}
	}
	if len(keys) == 0 {
		t.Fatal("the chart README has no table of the configuration keys it leaves alone")
	}
	return keys
}

// TestEveryConfigKeyHasAValue: every key `toolsidecar config` lists is set
// by the config.yaml the chart renders from testdata/every-value.yaml (a
// key with children, such as executor.lanes, by one of them), or is in the
// chart README's table of keys it leaves alone, with the reason; a key of
// that table that the chart does set is stale. A key added to the daemon
// fails here until the chart has a value for it or a reason.
func TestEveryConfigKeyHasAValue(t *testing.T) {
	rendered := explain(t, configOf(t, decode(t, render(t, "testdata/every-value.yaml")), "rel-toolsidecar-config"))
	alone := leftAlone(t)
	for key := range explain(t, "") {
		set := rendered[key] == "file"
		for k, src := range rendered {
			set = set || (strings.HasPrefix(k, key+".") && src == "file")
		}
		_, reason := alone[key]
		switch {
		case !set && !reason:
			t.Errorf("config key %s has no chart value: add one (values.yaml, values.schema.json, templates/_helpers.tpl, testdata/every-value.yaml) or a row to the chart README's keys it leaves alone", key)
		case set && reason:
			t.Errorf("config key %s is set by the chart, yet the README says it leaves it alone", key)
		}
		delete(alone, key)
	}
	for key := range alone {
		t.Errorf("the chart README leaves alone %s, which toolsidecar config does not list", key)
	}
}

// TestUpstreamKinds: every upstream kind renders into the application's
// pod, decodes strictly, and gives a config.yaml the daemon loads with
// that kind; the upstream key (and a hosted kind's webhook secret) come
// from Secrets mounted read-only at the files the config names.
func TestUpstreamKinds(t *testing.T) {
	for _, kind := range []string{"core", "openai", "responses", "anthropic", "openai-agents", "anthropic-agents"} {
		t.Run(kind, func(t *testing.T) {
			set := []string{"toolsidecar.upstream.kind=" + kind, "toolsidecar.upstream.url=https://api.example.com/v1",
				"toolsidecar.upstream.apiKeySecret.name=upstream"}
			hosted := strings.HasSuffix(kind, "-agents")
			if hosted {
				set = append(set, "toolsidecar.upstream.webhookSecret.name=webhooks")
			}
			o := decode(t, renderApp(t, set...))
			cfg := configOf(t, o, "rel-toolsidecar-config")
			if src := explain(t, cfg); src["upstream.kind"] != "file" || src["upstream.api_key_file"] != "file" ||
				(src["upstream.webhook_secret_file"] == "file") != hosted {
				t.Errorf("sources %v of:\n%s", src, cfg)
			}
			hasAll(t, "config.yaml", cfg, "kind: "+kind, "api_key_file: /var/run/secrets/toolsidecar/upstream/api-key")
			d, c := app(t, o)
			mounts := map[string]string{"upstream-api-key": "upstream"}
			if hosted {
				mounts["upstream-webhook-secret"] = "webhooks"
			}
			for name, secret := range mounts {
				v, m := volume(d.Spec.Template.Spec, name), mount(c, name)
				if v == nil || v.Secret == nil || v.Secret.SecretName != secret || m == nil || !m.ReadOnly || !strings.Contains(cfg, m.MountPath+"/") {
					t.Errorf("%s: volume %+v, mount %+v", name, v, m)
				}
			}
		})
	}
	if out := renderFails(t, "upstream.kind=openai"); !strings.Contains(out, "url") {
		t.Errorf("kind openai without a url: %s", out)
	}
}

// TestImageMustBeSet: no image is published, so the chart has no default
// repository: rendering the sidecar or the workers without one fails,
// saying what to set and where the build is described; a digest pins the
// image in place of the tag.
func TestImageMustBeSet(t *testing.T) {
	want := "image.repository: set it to the registry you pushed the image of `make image` to (docs/kubernetes.md"
	if out := renderFails(t, "workers.enabled=true", "nats.url=nats://nats:4222"); !strings.Contains(out, want) {
		t.Errorf("workers without image.repository: %s", out)
	}
	depOnce.Do(func() { helm(t, "dependency", "update", appChart, "--skip-refresh") })
	if out, err := exec.Command(helmPath(), templateArgs(appChart, "", []string{"toolsidecar.image.repository="})...).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), want) {
		t.Errorf("the sidecar without image.repository (err %v): %.300s", err, out)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	_, c := app(t, decode(t, renderApp(t, "toolsidecar.image.digest="+digest)))
	if c.Image != "registry.example.com/toolsidecar@"+digest {
		t.Errorf("image %q: want the repository pinned by digest", c.Image)
	}
}

// TestToolSchemaIsTheDaemons: the chart validates tools[] (and
// workers.tools[]) with the tool schema of config.schema.json, so that
// every key a tool may have is accepted and no other.
func TestToolSchemaIsTheDaemons(t *testing.T) {
	read := func(path string) map[string]any {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return v
	}
	daemonTool := read("../../config.schema.json")["properties"].(map[string]any)["tools"].(map[string]any)["items"]
	chartTool := read(filepath.Join(chart, "values.schema.json"))["$defs"].(map[string]any)["tool"]
	if !reflect.DeepEqual(daemonTool, chartTool) {
		t.Error("values.schema.json's $defs.tool differs from config.schema.json's tools items: copy it over")
	}
}
