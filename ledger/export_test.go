package ledger

import "context"

// PutEntry writes an outcome ledger entry as it is given: one of an
// earlier release's format, say.
func (l *Ledger) PutEntry(ctx context.Context, actionID string, value []byte) error {
	_, err := l.kv.Put(ctx, actionID, value)
	return err
}

// KeepNow rewrites the lease's run key at once, as the upkeep does.
func (l *Lease) KeepNow() { l.keep(l.ls.gen.Load()) }

// BeatNow renews the sidecar's key at once, for tests that stop the
// renewals to let it lapse under its leases.
func BeatNow(ls *Leases) { ls.beat() }

// UpkeepNow runs one pass of the run keys' upkeep.
func UpkeepNow(ls *Leases) { ls.upkeep() }

// RenewalOrder is the order in which the next upkeep writes the held
// leases' keys: their run IDs.
func RenewalOrder(ls *Leases) []string {
	var ids []string
	for _, l := range ls.renewalOrder(func(*Lease) bool { return true }) {
		ids = append(ids, l.runID)
	}
	return ids
}
