package server_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestExemplarsInOpenMetrics: with tracing on, a drive sent with a sampled
// traceparent leaves that trace's id as the exemplar of the call and drive
// histograms' buckets, in OpenMetrics (which a scraper asks for); the
// Prometheus text format, which has no exemplars, is still served to a
// scraper that asks for nothing else.
func TestExemplarsInOpenMetrics(t *testing.T) {
	env := testenv.Start(t, threeCalls(), testenv.Options{Config: testenv.Traced(t)}, standardTools()...)
	sc := &sidecar{env: env, url: env.URL}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	r := env.NewRun()
	resp := sc.do(t, context.Background(), "POST", "/v1/runs/"+r.RunID+"/drive", sc.driveBody(r), "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("drive: %s", resp.Status)
	}
	scrape := func(accept string) (string, string) {
		t.Helper()
		resp := sc.do(t, context.Background(), "GET", "/metrics", "", "Accept", accept)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.Header.Get("Content-Type"), string(body)
	}
	ctype, om := scrape("application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.5")
	if !strings.HasPrefix(ctype, "application/openmetrics-text") {
		t.Fatalf("Content-Type %q, want OpenMetrics", ctype)
	}
	for _, family := range []string{`toolsidecar_call_duration_seconds_bucket\{tool="echo"`, `toolsidecar_drive_duration_seconds_bucket\{status="completed"`} {
		re := regexp.MustCompile(family + `,le="[^"]+"\} \d+ # \{trace_id="` + traceID + `"\} [0-9.e-]+`)
		if !re.MatchString(om) {
			t.Errorf("no bucket of %s carries the drive's trace as its exemplar:\n%s", family, grep(om, "duration_seconds_bucket"))
		}
	}
	ctype, text := scrape("text/plain")
	if !strings.HasPrefix(ctype, "text/plain") || strings.Contains(text, "trace_id") || !strings.Contains(text, "toolsidecar_drive_duration_seconds_count") {
		t.Errorf("the text format (%q) should have the histograms and no exemplar", ctype)
	}
}

// grep keeps the lines of s that contain sub.
func grep(s, sub string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}
