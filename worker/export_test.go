package worker

// Started is how many runners w has started.
func Started(w *Worker) int {
	w.spawnMu.Lock()
	defer w.spawnMu.Unlock()
	return w.started
}
