package config

import "time"

// Durability configures durable mode: an outcome ledger and captured
// replies on JetStream, so that a restarted sidecar submits the results
// that arrived while it was away.
type Durability struct {
	// Enabled turns durable mode on where the NATS server has JetStream
	// (the embedded one does). default: true
	Enabled bool `koanf:"enabled"`
	// Replicas of the ledger and the reply stream on a cluster. default: 1
	Replicas int `koanf:"replicas"`
	// LeaseTTL is how long a sidecar's run leases outlive the last renewal
	// of its lease key (renewed every third of it): the longest a drive
	// request that reaches another sidecar waits, after the first one
	// died, before that sidecar resumes the run. Sidecars sharing a NATS
	// cluster must use one value. default: 10s
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// MaxBytes bounds each JetStream stream and bucket the sidecar creates
	// (outcomes, worker replies, dedupe and claim-checked results,
	// approvals). The reply stream, which workers publish to, keeps one
	// message per subject, each at most executor.max_result_bytes and
	// 64 KiB, and drops its oldest past the bound. default: 1 GiB
	MaxBytes int64 `koanf:"max_bytes"`
}

func (d Durability) validate() []error {
	p := problems{prefix: "durability"}
	if d.LeaseTTL < time.Second {
		p.add("lease_ttl", "must be at least 1s, got %s", d.LeaseTTL)
	}
	if d.Replicas < 1 || d.Replicas > 5 {
		p.add("replicas", "must be 1 to 5, got %d", d.Replicas)
	}
	p.positive(map[string]int64{"max_bytes": d.MaxBytes}, numberText)
	return p.list
}
