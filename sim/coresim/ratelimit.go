package coresim

import (
	"net"
	"net/http"
	"strings"
	"time"
)

// RateLimit is a front that limits each client address as nginx's
// limit_req does with nodelay (Core's shipped docker/nginx/nginx.conf:
// rate=30r/m, burst=20): a leaky bucket per address that drains at
// PerMinute a minute; a request that would fill it past Burst is refused
// with nginx's 503 page and no Retry-After, and never reaches Core.
type RateLimit struct {
	PerMinute float64 `yaml:"per_minute" json:"per_minute"`
	Burst     float64 `yaml:"burst" json:"burst"`
}

// ShippedLimit is the limit of Core's shipped nginx front.
var ShippedLimit = RateLimit{PerMinute: 30, Burst: 20}

// nginxRefusal is the page nginx sends with a limit_req refusal.
const nginxRefusal = "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n" +
	"<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>\r\n"

// bucket is one address's state, as nginx keeps it: the excess over the
// rate, in requests, at the time of the last request accepted.
type bucket struct {
	excess float64
	at     time.Time
}

// SetRateLimit puts the front in place (a zero RateLimit removes it) and
// starts its counts afresh.
func (s *Sim) SetRateLimit(l RateLimit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit, s.buckets, s.accepted, s.refused = l, map[string]*bucket{}, 0, 0
}

// LimitCounts are the requests the front let through and those it
// refused since SetRateLimit.
func (s *Sim) LimitCounts() (accepted, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, s.refused
}

// admit applies the front to r; false: r was refused (and answered).
func (s *Sim) admit(w http.ResponseWriter, r *http.Request) bool {
	if strings.HasPrefix(r.URL.Path, "/_sim/") {
		return true
	}
	s.mu.Lock()
	l := s.limit
	if l.PerMinute <= 0 {
		s.mu.Unlock()
		return true
	}
	addr, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		addr = r.RemoteAddr
	}
	now := s.now()
	// nginx (ngx_http_limit_req_lookup): an address's first request is
	// stored with no excess; each later one adds 1 to the excess drained
	// since, and is refused, and not stored, when that exceeds the burst.
	b := s.buckets[addr]
	excess := 0.0
	if b == nil {
		b = &bucket{}
		s.buckets[addr] = b
	} else {
		excess = max(0, b.excess-l.PerMinute/60*now.Sub(b.at).Seconds()+1)
	}
	if excess > l.Burst {
		s.refused++
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(nginxRefusal))
		return false
	}
	b.excess, b.at = excess, now
	s.accepted++
	s.mu.Unlock()
	return true
}
