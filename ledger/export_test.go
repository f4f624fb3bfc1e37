package ledger

// RenewNow renews the lease at once, for tests that stop the renewal loop
// to let a lease expire under its holder.
func (l *Lease) RenewNow() { l.renew() }
