package live

import (
	"encoding/json"
	"net/http"

	"github.com/projectdavid/toolsidecar/tool"
)

// RunSummary is a run as GET /v1/sidecar/runs lists it: its turns counted,
// not drawn.
type RunSummary struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Started int64  `json:"started"`
	Ended   int64  `json:"ended,omitempty"`
	Turns   int    `json:"turns"`
	Calls   int    `json:"calls"`
	Errors  int    `json:"errors"`
	Error   string `json:"error,omitempty"`
}

// RunList is the body of GET /v1/sidecar/runs.
type RunList struct {
	Runs []RunSummary `json:"runs"`
}

// Runs answers GET /v1/sidecar/runs (the runs the board keeps, the most
// recent first) and GET /v1/sidecar/runs/{run_id} (one run with its turns
// and calls), for `toolsidecar runs` and scripts. They read the board the
// live view draws: the runs in flight and the last server.ui_history, of
// those the request may see (Access). Another caller's run is answered as
// one the board does not keep: 404, which does not tell that it exists.
func Runs(b *Board, access Access) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := access.viewer(r)
		id := r.PathValue("run_id")
		if id == "" {
			list := RunList{Runs: []RunSummary{}}
			for _, run := range v.runs(b.snapshot()) {
				list.Runs = append(list.Runs, RunSummary{ID: run.ID, Status: run.Status, Started: run.Started, Ended: run.Ended,
					Turns: len(run.Turns), Calls: run.Calls, Errors: run.Errors, Error: run.Error})
			}
			reply(w, http.StatusOK, list)
			return
		}
		if err := tool.CheckID("run_id", id); err != nil {
			reply(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		run, ok := b.run(id)
		if !ok || !v.sees(&run) {
			reply(w, http.StatusNotFound, map[string]string{"error": "run " + id + " is not among the runs this sidecar keeps (those in flight and the last server.ui_history)"})
			return
		}
		reply(w, http.StatusOK, run)
	})
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
