package ledger

// RenewNow renews the lease at once, for tests that stop the renewal loop
// to let a lease expire under its holder.
func (l *Lease) RenewNow() { l.renew() }

// RenewalOrder is the order in which the next pass renews the held
// leases: their run IDs.
func RenewalOrder(ls *Leases) []string {
	var ids []string
	for _, l := range ls.renewalOrder() {
		ids = append(ids, l.runID)
	}
	return ids
}
