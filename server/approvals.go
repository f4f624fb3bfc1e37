package server

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/projectdavid/toolsidecar/approval"
	"github.com/projectdavid/toolsidecar/live"
	"github.com/projectdavid/toolsidecar/tool"
)

// decisionBody is the body of POST /v1/approvals/{action_id}.
type decisionBody struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason"`
	// Approver is the name the person gives; how the request was
	// authenticated is recorded beside it.
	Approver string `json:"approver"`
}

// Bounds of a decision's free text: it goes into logs and the summary.
const (
	maxReasonBytes   = 1 << 10
	maxApproverBytes = 128
)

// listApprovals answers GET /v1/approvals: the approvals without a verdict,
// of every sidecar that shares the store, that the request owns (the
// operator every one): another caller's carry its call's arguments.
func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) {
	es, err := s.cfg.Approvals.Pending(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	es = slices.DeleteFunc(es, func(e approval.Entry) bool { return !s.access().Owns(r, e.Owner) })
	writeJSON(w, http.StatusOK, map[string]any{"approvals": es})
}

// access decides, as the live view does, whose approvals a request sees
// and decides: its own credentials', the operator's token every one.
func (s *Server) access() live.Access {
	return live.Access{Operator: s.cfg.Operator, Token: s.cfg.Token}
}

// decide answers POST /v1/approvals/{action_id}: 200 with the decided
// approval, 404 when there is none or it is another caller's (the
// operator decides every one), 409 when it was decided already (the body
// then says how).
func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	actionID := r.PathValue("action_id")
	if err := tool.CheckID("action_id", actionID); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var body decisionBody
	if !decodeStrict(w, r, &body) {
		return
	}
	outcome := map[string]string{approval.DecisionApprove: approval.Approved, approval.DecisionDeny: approval.Denied}[body.Decision]
	switch {
	case outcome == "":
		writeError(w, http.StatusBadRequest, `decision must be "approve" or "deny"`)
		return
	case len(body.Reason) > maxReasonBytes || len(body.Approver) > maxApproverBytes:
		writeError(w, http.StatusBadRequest, "reason is bounded to 1 KiB and approver to 128 bytes")
		return
	}
	// Another caller's approval is answered as none: 404, which does not
	// tell that it exists. Its owner never changes, so the check holds
	// for the decision that follows.
	switch e, err := s.cfg.Approvals.Get(r.Context(), actionID); {
	case errors.Is(err, approval.ErrNotFound) || err == nil && !s.access().Owns(r, e.Owner):
		writeError(w, http.StatusNotFound, "no approval is pending for action "+actionID)
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	v := approval.Verdict{Outcome: outcome, Reason: body.Reason, Approver: body.Approver, AuthenticatedAs: s.authenticatedAs(r),
		DecidedAt: time.Now().UTC()}
	e, err := s.cfg.Approvals.Decide(r.Context(), actionID, v)
	switch {
	case errors.Is(err, approval.ErrNotFound):
		writeError(w, http.StatusNotFound, "no approval is pending for action "+actionID)
	case errors.Is(err, approval.ErrDecided):
		writeJSON(w, http.StatusConflict, map[string]any{"error": "the approval was decided already", "approval": e})
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	default:
		s.log.Info("approval decided", "action_id", actionID, "run_id", e.RunID, "tool", e.Tool, "outcome", outcome,
			"approver", v.Approver, "authenticated_as", v.AuthenticatedAs, "reason", v.Reason)
		writeJSON(w, http.StatusOK, e)
	}
}

// authenticatedAs names how a request was authenticated, without the
// secret: the operator's token, the API token, a Core key (by a short
// hash), or nothing (an open loopback listener).
func (s *Server) authenticatedAs(r *http.Request) string {
	switch key := r.Header.Get("X-API-Key"); {
	case bearer(r, s.cfg.Operator):
		return "operator"
	case s.cfg.Token != "":
		return "token"
	case key != "":
		sum := sha256.Sum256([]byte(key))
		return "key:" + hex.EncodeToString(sum[:4])
	}
	return "none"
}
