package server

import (
	"mime"
	"net"
	"net/http"
	"strings"

	"github.com/projectdavid/toolsidecar/tool"
)

// The API defends itself against the browser next to it: loopback keeps
// other hosts out, not a web page the user opens. Three checks, with or
// without the API token (docs/security.md):
//
//   - Host: a request must name the sidecar by an IP address, by
//     localhost, or by a name in server.allowed_hosts. A page whose own DNS
//     name was rebound to 127.0.0.1 (DNS rebinding) sends its own name, and
//     could otherwise read the answers as same-origin.
//   - Cross-origin: a state-changing request that a browser marks as sent
//     by another site (Sec-Fetch-Site, or an Origin that is not the Host)
//     is refused: net/http's CrossOriginProtection.
//   - JSON: a state-changing request of the sidecar's own routes with a
//     body must say application/json. A form, or fetch with text/plain, is
//     a "simple" request that a browser sends cross-site without asking
//     first; JSON needs a preflight, which the sidecar never grants.
//
// Clients that are not browsers (the SDKs, curl with -H 'Content-Type:
// application/json') send none of the headers that would refuse them.

// hosts is the Host allow-list.
type hosts struct {
	any   bool
	names map[string]bool
}

func newHosts(allowed []string) hosts {
	h := hosts{names: map[string]bool{}}
	for _, n := range allowed {
		if n == "*" {
			h.any = true
		}
		h.names[strings.ToLower(strings.TrimSuffix(n, "."))] = true
	}
	return h
}

// allows reports whether a request naming host (the Host header, with or
// without a port) may be served. An IP address is always allowed: a page
// cannot make a browser send one for its own origin, so it is never the
// name of a rebound page.
func (h hosts) allows(host string) bool {
	if h.any {
		return true
	}
	name := host
	if n, _, err := net.SplitHostPort(host); err == nil {
		name = n
	}
	name = strings.ToLower(strings.TrimSuffix(strings.Trim(name, "[]"), "."))
	switch {
	case name == "":
		return false
	case net.ParseIP(name) != nil, name == "localhost", strings.HasSuffix(name, ".localhost"):
		return true
	}
	return h.names[name]
}

// guard applies the Host check to every request and the cross-origin
// check to state-changing ones, before next.
func (h hosts) guard(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusForbidden, "cross-origin request refused: a page of another site may not act through the sidecar")
	}))
	checked := cop.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.allows(r.Host) {
			writeError(w, http.StatusForbidden, "host "+tool.Excerpt(r.Host)+" is not allowed: name the sidecar by its address or localhost, or add the name to server.allowed_hosts")
			return
		}
		checked.ServeHTTP(w, r)
	})
}

// jsonBody reports whether a request may go on to one of the sidecar's own
// routes: a request that may change state and carries a body must send it
// as JSON.
func jsonBody(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	if r.ContentLength == 0 && r.Header.Get("Content-Type") == "" {
		return true // no body
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
