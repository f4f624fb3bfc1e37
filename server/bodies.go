package server

import (
	"bytes"
	"io"
	"net/http"

	"github.com/projectdavid/toolsidecar/internal/dupkey"
)

// changesState reports a method whose body the route acts on.
func changesState(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// uniqueKeys reads the body, bounded already, and refuses (400, in the
// route's shape) one in which an object gives a key twice: the route and
// whoever reads the body after it (Core, a model API, a worker) could
// each take a different one of them. The route reads the body as it
// came, a read error included (413 past the bound, in its own words).
func uniqueKeys(w http.ResponseWriter, r *http.Request, rt Route) bool {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(raw), errReader{err}))
		return true
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	depth := 0 // every level
	if rt.Forwarded {
		depth = 1
	}
	if de := dupkey.Find(raw, depth); de != nil {
		writeErr := writeError
		if rt.Errors != nil {
			writeErr = rt.Errors
		}
		writeErr(w, http.StatusBadRequest, de.Error())
		return false
	}
	return true
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
