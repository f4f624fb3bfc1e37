package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/syncbuf"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// TestCheckAndToolsReadDeclarations: on an external bus where a Go worker
// declares lookup in its code, `tools --source` lists it as the worker's
// with its derived schema, and `check` of a file whose entry for lookup
// has another schema fails naming both sources.
func TestCheckAndToolsReadDeclarations(t *testing.T) {
	url := lookupWorker(t)

	dir := t.TempDir()
	bare := filepath.Join(dir, "bare.yaml")
	// No sidecar answers at server.listen: these read the bus, not a daemon.
	away := "server: {listen: \"" + testenv.FreeAddr(t) + "\"}\n"
	os.WriteFile(bare, []byte(away+"nats: {url: "+url+"}\n"), 0o600)
	var out, errOut bytes.Buffer
	if code := run([]string{"tools", "--source", "--config", bare}, &out, &errOut); code != 0 {
		t.Fatalf("tools exit %d: %s", code, errOut.String())
	}
	var listed []tool.SourcedTool
	if err := json.Unmarshal(out.Bytes(), &listed); err != nil || len(listed) != 1 || listed[0].Function.Name != "lookup" ||
		listed[0].Source != "worker" || !strings.Contains(string(listed[0].Function.Parameters), `"city"`) ||
		len(listed[0].DeclaredBy) != 1 || !strings.HasPrefix(listed[0].DeclaredBy[0], "go worker ") {
		t.Fatalf("tools --source: %s (%v)", out.String(), err)
	}

	contra := filepath.Join(dir, "contra.yaml")
	os.WriteFile(contra, []byte(away+"nats: {url: "+url+"}\ntools:\n  - {name: lookup, parameters: {type: object, properties: {town: {type: string}}}}\n"), 0o600)
	out.Reset()
	errOut.Reset()
	if code := run([]string{"check", "--config", contra}, &out, &errOut); code != 1 {
		t.Fatalf("check of a contradicted declaration: exit %d, want 1", code)
	}
	if msg := errOut.String(); !strings.Contains(msg, "tools[0] (lookup) in the configuration") || !strings.Contains(msg, "go worker ") || !strings.Contains(msg, `"town"`) {
		t.Errorf("check's error %q: want the file's entry and the worker named", msg)
	}
}

// TestToolsReadsTheRunningDaemon: with the embedded server, only the
// daemon sees the tools workers declare; `tools --source` with the
// daemon's configuration lists them from it, schema, side effects and
// declarer included, and without a daemon says it lists the file's only.
// check warns of the file's nats tools that no worker declares there.
func TestToolsReadsTheRunningDaemon(t *testing.T) {
	env := testenv.Start(t, coresim.Scenario{}, testenv.Options{NATS: func(n *config.NATS) { n.DiscoverInterval = 100 * time.Millisecond }})
	nc, err := nats.Connect(env.NATSURL, nats.UserInfo(testenv.WorkerUser, env.WorkerPassword))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	w := worker.New(nc, testenv.Prefix)
	type args struct {
		City string `json:"city"`
	}
	if err := worker.Declare(w, "lookup", worker.Spec{Description: "Look a city up", SideEffects: tool.ReadOnly, Retries: 2},
		func(context.Context, *tool.Call, args) (string, error) { return "", nil }); err != nil {
		t.Fatal(err)
	}
	natstest.Serve(t, w)
	testenv.WaitDeclared(t, env.URL, map[string]string{"lookup": "go"})

	f := filepath.Join(t.TempDir(), "daemon.yaml")
	os.WriteFile(f, []byte("server: {listen: \""+strings.TrimPrefix(env.URL, "http://")+"\"}\n"), 0o600)
	var out, errOut bytes.Buffer
	if code := run([]string{"tools", "--source", "--config", f}, &out, &errOut); code != 0 {
		t.Fatalf("tools exit %d: %s", code, errOut.String())
	}
	var listed []tool.SourcedTool
	if err := json.Unmarshal(out.Bytes(), &listed); err != nil || len(listed) != 1 || listed[0].Function.Name != "lookup" ||
		listed[0].Source != "worker" || !strings.Contains(string(listed[0].Function.Parameters), `"city"`) ||
		listed[0].SideEffects != tool.ReadOnly || listed[0].Retries != 2 || listed[0].Function.Description != "Look a city up" {
		t.Fatalf("tools --source from the daemon: %s (%v)", out.String(), err)
	}

	// check warns of the file's nats tools that no worker declares in the
	// running daemon, and of no other.
	os.WriteFile(f, []byte("server: {listen: \""+strings.TrimPrefix(env.URL, "http://")+"\"}\ntools:\n  - {name: lookup, retries: 2}\n  - {name: orphan, parameters: {type: object}}\n"), 0o600)
	errOut.Reset()
	if code := run([]string{"check", "--config", f}, &out, &errOut); code != 0 ||
		!strings.Contains(errOut.String(), "warning: no worker was seen declaring orphan (the running daemon's tools)") {
		t.Errorf("check beside the daemon: exit %d: %s", code, errOut.String())
	}

	os.WriteFile(f, []byte("server: {listen: \"127.0.0.1:1\"}\n"), 0o600)
	out.Reset()
	errOut.Reset()
	if code := run([]string{"tools", "--config", f}, &out, &errOut); code != 0 || strings.TrimSpace(out.String()) != "[]" ||
		!strings.Contains(errOut.String(), "the configuration's tools only") {
		t.Errorf("tools without a daemon: exit %d, out %q, err %q", code, out.String(), errOut.String())
	}
}

// TestConflictOneAnswer: a file whose entry for a tool has another schema
// than the one a real worker on the bus declares gets one answer from
// check, from a start and from a reload alike: the file's entry is in
// force and the declaration is left out, named with both sources and
// both schemas in the same words. check, which cannot put anything in
// force, fails on it; the start starts and the reload is put in force,
// as no client of the bus may keep the operator's file out.
func TestConflictOneAnswer(t *testing.T) {
	url := lookupWorker(t)

	dir := t.TempDir()
	head := "server: {listen: \"" + testenv.FreeAddr(t) + "\"}\nnats: {url: " + url + "}\n"
	agreeing := head + "tools:\n  - {name: lookup, retries: 1}\n"
	contra := head + "tools:\n  - {name: lookup, parameters: {type: object, properties: {town: {type: string}}}}\n"
	// The conflict as every one of the three names it.
	want := []string{"tools[0] (lookup) in the configuration and the tool declared by go worker ", "disagree", "town", "city"}
	says := func(what, text string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s does not say %q:\n%s", what, w, text)
			}
		}
	}
	fileOnly := func(what string, s *sidecar.Sidecar) {
		t.Helper()
		if tl, ok := s.Tools().Lookup("lookup"); !ok || tl.Source != "config" || !strings.Contains(string(tl.Parameters), `"town"`) {
			t.Errorf("%s: lookup in force from %s with %s, want the file's entry", what, tl.Source, tl.Parameters)
		}
	}

	path := filepath.Join(dir, "config.yaml")
	os.WriteFile(path, []byte(contra), 0o600)
	var out, errOut bytes.Buffer
	if code := run([]string{"check", "--config", path}, &out, &errOut); code != 1 {
		t.Errorf("check: exit %d, want 1\n%s", code, errOut.String())
	}
	says("check", errOut.String())

	var logs syncbuf.Buffer
	start := func() *sidecar.Sidecar {
		t.Helper()
		cfg, err := config.Load(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := sidecar.Start(context.Background(), cfg, sidecar.WithReload(path, nil), sidecar.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		t.Cleanup(func() { s.Shutdown(context.Background()) })
		return s
	}
	s := start()
	fileOnly("start", s)
	says("the start's log", logs.String())
	if !strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("the start's log has no error:\n%s", logs.String())
	}
	s.Shutdown(context.Background())

	os.WriteFile(path, []byte(agreeing), 0o600)
	s = start()
	mark := len(logs.String())
	if tl, _ := s.Tools().Lookup("lookup"); tl.Source != "config+worker" {
		t.Fatalf("agreeing: lookup in force as %+v", tl)
	}
	os.WriteFile(path, []byte(contra), 0o600)
	if err := s.Reload(context.Background()); err != nil {
		t.Errorf("reload: %v, want the file in force as at start", err)
	}
	fileOnly("reload", s)
	says("the reload's log", logs.String()[mark:])
}

// lookupWorker starts a NATS server with a Go worker on it that declares
// lookup in its code, and returns the server's URL.
func lookupWorker(t *testing.T) string {
	t.Helper()
	url := natstest.Start(t)
	w := worker.New(natstest.Dial(t, url), "toolsidecar.tools")
	type args struct {
		City string `json:"city" jsonschema:"the city"`
	}
	if err := worker.Declare(w, "lookup", worker.Spec{Description: "Look a city up", SideEffects: tool.ReadOnly},
		func(context.Context, *tool.Call, args) (string, error) { return "", nil }); err != nil {
		t.Fatal(err)
	}
	natstest.Serve(t, w)
	return url
}
