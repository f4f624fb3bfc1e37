package sidecar

import (
	"testing"

	"github.com/projectdavid/toolsidecar/config"
)

// TestUpstreamURLShowsNoSecret: the URL that the ready log and
// toolsidecar_upstream_info show is the upstream's, without the password
// of its userinfo and without its query, where a key may travel.
func TestUpstreamURLShowsNoSecret(t *testing.T) {
	for _, tc := range []struct {
		cfg  config.Config
		want string
	}{
		{config.Config{Core: config.Core{URL: "http://alice:s3cret@core:9000/"}, Upstream: config.Upstream{Kind: config.UpstreamCore}}, "http://alice:xxxxx@core:9000/"},
		{config.Config{Core: config.Core{URL: "http://core:9000"}, Upstream: config.Upstream{Kind: config.UpstreamOpenAI, URL: "https://llm.example/v1?api-key=s3cret#x"}}, "https://llm.example/v1?…"},
	} {
		s := &Sidecar{cfg: tc.cfg}
		if got := s.upstreamURL(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.cfg.Upstream, got, tc.want)
		}
	}
}
