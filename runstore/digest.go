package runstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Digest is the hex SHA-256 of parts, each length-prefixed so that no two
// lists of parts hash alike: a request's digest, which names its index.
func Digest(parts ...[]byte) string { return hex.EncodeToString(digestBytes(parts...)) }

// ShortDigest is Digest cut to 120 bits (30 hex digits), for ids that a
// run's records are keyed by.
func ShortDigest(parts ...[]byte) string { return hex.EncodeToString(digestBytes(parts...)[:15]) }

func digestBytes(parts ...[]byte) []byte {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return h.Sum(nil)
}

// ActionID is a call's identity in its run: derived from the run, the
// turn, the id the model gave it (or its position when it gave none) and
// what it asks, so that it is the same on every retry of the run (the
// worker's Tool-Idempotency-Key, the ledger's key, the key of its start
// mark and output here), and a call the model makes differently when a
// turn is asked again is another call.
func ActionID(runID string, turn, pos int, modelID, tool, args string) string {
	return "act-" + ShortDigest([]byte(runID), fmt.Appendf(nil, "%d/%d", turn, pos), []byte(modelID), []byte(tool), []byte(args))
}
