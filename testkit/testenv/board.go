package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// Board is what a request with header sees of the live view at url: the
// run ids GET /v1/sidecar/runs lists, and those of /ui/events' snapshot,
// each sorted.
func Board(t testing.TB, url string, header http.Header) (listed, streamed []string) {
	t.Helper()
	var list struct{ Runs []struct{ ID string } }
	if status := BoardGet(t, url+"/v1/sidecar/runs", header, &list); status != http.StatusOK {
		t.Fatalf("GET /v1/sidecar/runs: %d", status)
	}
	for _, r := range list.Runs {
		listed = append(listed, r.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/ui/events", nil)
	req.Header = header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var snap struct{ Runs []struct{ ID string } }
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			if err := json.Unmarshal([]byte(data), &snap); err != nil {
				t.Fatalf("the live view's snapshot: %v", err)
			}
			break
		}
	}
	for _, r := range snap.Runs {
		streamed = append(streamed, r.ID)
	}
	slices.Sort(listed)
	slices.Sort(streamed)
	return listed, streamed
}

// BoardGet reads url with header into v (when the answer is 200), and
// returns the status.
func BoardGet(t testing.TB, url string, header http.Header, v any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header = header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
	return resp.StatusCode
}
