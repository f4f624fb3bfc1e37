package bridge

// FireStale runs the timer and context callbacks of every waiting call as
// if they had fired late, for the earlier call that used the same waiter.
// It returns how many calls were waiting.
func (c *Client) FireStale() int {
	type stale struct {
		w   *waiter
		gen uint64
	}
	c.mu.Lock()
	var ws []stale
	for _, w := range c.pending {
		ws = append(ws, stale{w, w.gen - 1})
	}
	c.mu.Unlock()
	for _, s := range ws {
		s.w.expire()
		c.ended(s.w, s.gen)
	}
	return len(ws)
}

// Waiting counts the calls that wait for their workers (sent, OnSent
// returned, no outcome yet).
func (c *Client) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, w := range c.pending {
		if w.armed && !w.settled {
			n++
		}
	}
	return n
}
