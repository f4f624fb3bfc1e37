package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/live"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestRunsCommand: `toolsidecar runs list` and `runs show` read a running
// sidecar's runs over its API, with the token from a file or the
// environment: the table and the JSON name the run, its status, turns,
// calls and errors, and each call's tool and outcome; the JSON is the
// API's; the run ids complete from the daemon; a missing token, an
// unknown run and a daemon that is not there fail with the reason.
func TestRunsCommand(t *testing.T) {
	sc := coresim.Scenario{Turns: []coresim.Turn{
		{Calls: []coresim.Call{{Tool: "echo", ArgsJSON: `{"q": 1}`}, {Tool: "no_such_tool", ArgsJSON: `{}`}}},
		{Content: "done"},
	}}
	const token = "runs-token-3f9a"
	env := testenv.Start(t, sc, testenv.Options{Token: token}, testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})
	r := env.NewRun()
	env.DriveWhole(r, 2)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cli := func(wantCode int, args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != wantCode {
			t.Fatalf("toolsidecar %v: exit %d (stderr %q), want %d", args, code, errOut.String(), wantCode)
		}
		return out.String() + errOut.String()
	}
	at := []string{"--url", env.URL, "--token-file", tokenFile}

	table := cli(0, append([]string{"runs", "list"}, at...)...)
	row := ""
	for line := range strings.Lines(table) {
		if strings.HasPrefix(line, r.RunID+" ") {
			row = line
		}
	}
	if f := strings.Fields(row); len(f) < 7 || f[1] != "completed" || f[len(f)-3] != "2" || f[len(f)-2] != "2" || f[len(f)-1] != "1" {
		t.Fatalf("runs list:\n%s\nwant a row for %s: completed, 2 turns, 2 calls, 1 error", table, r.RunID)
	}
	var list live.RunList
	if err := json.Unmarshal([]byte(cli(0, append([]string{"runs", "list", "-o", "json"}, at...)...)), &list); err != nil || len(list.Runs) != 1 ||
		list.Runs[0].ID != r.RunID || list.Runs[0].Turns != 2 || list.Runs[0].Errors != 1 {
		t.Fatalf("runs list -o json: %+v (%v)", list, err)
	}

	shown := cli(0, append([]string{"runs", "show", r.RunID}, at...)...)
	for _, want := range []string{"status   completed", "turn 1,", "turn 2,", "echo", "no_such_tool", " ok "} {
		if !strings.Contains(shown, want) {
			t.Errorf("runs show lacks %q:\n%s", want, shown)
		}
	}
	t.Setenv("TOOLSIDECAR_TOKEN", token) // the token from the environment
	var viaCLI, viaAPI live.Run
	if err := json.Unmarshal([]byte(cli(0, "runs", "show", r.RunID, "-o", "json", "--url", env.URL)), &viaCLI); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, env.URL+"/v1/sidecar/runs/"+r.RunID, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&viaAPI); err != nil || !reflect.DeepEqual(viaCLI, viaAPI) || len(viaAPI.Turns) != 2 {
		t.Fatalf("runs show -o json %+v, the API %+v (%v)", viaCLI, viaAPI, err)
	}
	if got := cli(0, "__complete", "runs", "show", "--url", env.URL, ""); !strings.Contains(got, r.RunID+"\tcompleted") {
		t.Errorf("run ids do not complete from the daemon:\n%s", got)
	}

	if got := cli(1, "runs", "show", "run_unknown", "--url", env.URL); !strings.Contains(got, "404") || !strings.Contains(got, "not among the runs") {
		t.Errorf("an unknown run: %q", got)
	}
	t.Setenv("TOOLSIDECAR_TOKEN", "")
	if got := cli(1, "runs", "list", "--url", env.URL); !strings.Contains(got, "401") {
		t.Errorf("without the token: %q", got)
	}
	if got := cli(1, "runs", "list", "--url", "http://"+testenv.FreeAddr(t)); !strings.Contains(got, "connection refused") {
		t.Errorf("no daemon there: %q", got)
	}
}

// TestRunsShowProblemLines: a call whose error lists problems a line each
// (a validation error) shows each on a row of its own under the call's
// detail, indented, and the calls after it keep their columns.
func TestRunsShowProblemLines(t *testing.T) {
	r := live.Run{ID: "run_1", Status: "completed", Turns: []*live.Turn{{N: 1, Calls: []*live.Call{
		{ToolCallID: "call_a", Tool: "get_weather", Outcome: "invalid_args",
			Error: "invalid arguments for tool \"get_weather\":\n- at /: missing property 'city'\n- at /days: got string, want integer"},
		{ToolCallID: "call_b", Tool: "echo", Outcome: "ok", Preview: "{}"},
	}}}}
	var out bytes.Buffer
	if err := printRun(&out, r); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	row := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "call_a") })
	if row < 0 || row+3 >= len(lines) {
		t.Fatalf("runs show:\n%s", out.String())
	}
	detail := strings.Index(lines[row], "invalid arguments")
	for k, want := range []string{"- at /: missing property 'city'", "- at /days: got string, want integer"} {
		if got := strings.Index(lines[row+1+k], want); got <= detail || strings.TrimSpace(lines[row+1+k]) != want {
			t.Errorf("problem %d is not alone on an indented line under the detail (column %d):\n%s", k, detail, out.String())
		}
	}
	if next := lines[row+3]; !strings.Contains(next, "call_b") || strings.Index(next, "echo") != strings.Index(lines[row], "get_weather") {
		t.Errorf("the next call lost its columns:\n%s", out.String())
	}
}
