package config

import (
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"
)

// NATS is the worker bus.
type NATS struct {
	// URL of a NATS server or cluster; empty starts the embedded server.
	URL string `koanf:"url"`
	// SubjectPrefix: a tool is served on <prefix>.<name>.
	// default: toolsidecar.tools
	SubjectPrefix string `koanf:"subject_prefix"`
	// Credentials for an external NATS, each from a file; at most one
	// kind. CredsFile is a JWT credentials file; User goes with
	// PasswordFile; TokenFile holds a token; NKeySeedFile an nkey seed.
	CredsFile    string   `koanf:"creds_file"`
	User         string   `koanf:"user"`
	PasswordFile string   `koanf:"password_file"`
	TokenFile    string   `koanf:"token_file"`
	NKeySeedFile string   `koanf:"nkey_seed_file"`
	TLS          TLS      `koanf:"tls"`
	Embedded     Embedded `koanf:"embedded"`
	// ConnectRetry is how long the first connection to an external NATS
	// is retried, each failure logged, before the sidecar gives up.
	// default: 30s
	ConnectRetry time.Duration `koanf:"connect_retry"`
	// DiscoverInterval is how often the sidecar asks the workers on the
	// bus for the tools they declare in their code: it learns their names
	// from $SRV.INFO, and takes each declaration only from a worker that
	// NATS lets serve the tool (a describe request on the tool's subject).
	// 0 turns discovery off. default: 2s
	DiscoverInterval time.Duration `koanf:"discover_interval"`
	// DiscoverGrace is how long a declared tool stays served while no
	// worker answers for it (a paused or busy worker): its calls wait or
	// time out as calls do meanwhile. A tool whose subject nobody serves
	// any more leaves at once. default: 10s
	DiscoverGrace time.Duration `koanf:"discover_grace"`
	// DiscoverAllow, when set, lists the tools that workers may declare
	// in their code: names, or patterns such as "weather_*" (Go's
	// path.Match). A declared tool it does not match is not served nor
	// offered to the model. default: [] (every tool a worker may serve)
	DiscoverAllow []string `koanf:"discover_allow"`
}

// DiscoverAllows reports a tool name that DiscoverAllow lets workers
// declare.
func (n NATS) DiscoverAllows(name string) bool {
	if len(n.DiscoverAllow) == 0 {
		return true
	}
	for _, p := range n.DiscoverAllow {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// TLS configures the client side of a TLS connection. All optional.
type TLS struct {
	CAFile   string `koanf:"ca_file"`
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
}

// Embedded configures the in-process NATS server. Authentication is on:
// the sidecar connects in process, workers connect as the users listed
// in Workers, and anonymous clients are refused unless AllowAnonymous.
type Embedded struct {
	// Listen is where workers connect. default: 127.0.0.1:4222
	Listen string `koanf:"listen"`
	// StoreDir holds JetStream's files (the ledger, the captured replies)
	// and the issued worker credentials: keep it across restarts. The
	// default is created 0700, and refused when it is there already and
	// is a symbolic link, another user's, or writable by others (another
	// local user made it first). A folder set here is refused when a user
	// other than this one or root owns it, or when it is this user's and
	// every user may write into it; a root-owned one every user may write
	// into (a Kubernetes emptyDir) is used, with a warning. default: <temp
	// dir>/toolsidecar-nats-<port>
	StoreDir string `koanf:"store_dir"`
	// Workers are the users workers connect as.
	Workers []Worker `koanf:"workers"`
	// AllowAnonymous lets clients without credentials in, with every
	// permission. default: false (a warning is logged when true)
	AllowAnonymous bool `koanf:"allow_anonymous"`
	// WorkerCredentials issues a worker user that may serve every tool,
	// its password kept in a file (mode 0600, WorkerCredentialsFile), which the worker libraries read: a worker on the same machine
	// (or sharing the folder) connects with no configuration. default: true
	WorkerCredentials bool `koanf:"worker_credentials"`
	// WorkerCredentialsFile is where that file is written, for a folder
	// that worker containers mount (the Helm chart's). default:
	// <store dir>/worker-credentials.json
	WorkerCredentialsFile string `koanf:"worker_credentials_file"`
	// TLS serves the listener over TLS: CertFile and KeyFile, and CAFile
	// to require client certificates signed by it. Optional.
	TLS TLS `koanf:"tls"`
	// Sync says when JetStream writes the ledger and the captured replies
	// to disk: always (each write is synced before it is acknowledged) or
	// periodic (nats-server's own default, every 2 minutes: a power
	// failure or an OS crash loses the writes acknowledged since the last
	// sync, and an unsafe call whose record is lost may run again).
	// default: always
	Sync string `koanf:"sync"`
}

// The values of nats.embedded.sync.
const (
	SyncAlways   = "always"
	SyncPeriodic = "periodic"
)

// Worker is a user of the embedded server: a worker process that may
// serve the listed tools (subscribe to their subjects, the cancel subject
// and discovery) and publish nothing but replies to the requests it got.
type Worker struct {
	Name string `koanf:"name"`
	// PasswordFile holds the worker's password; or NKey is its public
	// nkey (U...), whose seed only the worker has.
	PasswordFile string `koanf:"password_file"`
	NKey         string `koanf:"nkey"`
	// Tools the worker may serve; "*" for every tool under the prefix.
	Tools []string `koanf:"tools"`
}

// validate checks the NATS credentials: one kind at most for an external
// server, and embedded worker users that can log in.
func (n NATS) validate() []error {
	p := problems{prefix: "nats"}
	bad := p.add
	p.hostPort("embedded.listen", n.Embedded.Listen, false)
	p.positive(map[string]int64{"connect_retry": int64(n.ConnectRetry)}, durationText)
	if n.DiscoverInterval != 0 && n.DiscoverInterval < 100*time.Millisecond {
		bad("discover_interval", "must be 0 (off) or at least 100ms, got %s", n.DiscoverInterval)
	}
	if n.DiscoverGrace < 0 {
		bad("discover_grace", "must not be negative, got %s", n.DiscoverGrace)
	}
	for i, p := range n.DiscoverAllow {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			bad(fmt.Sprintf("discover_allow[%d]", i), "must be a tool name or a pattern, got %q", p)
		}
	}
	for _, u := range strings.Split(n.URL, ",") {
		if n.URL == "" {
			break
		}
		if pu, err := url.Parse(strings.TrimSpace(u)); err != nil || pu.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, pu.Scheme) {
			bad("url", "must be nats://, tls://, ws:// or wss:// URLs, separated by commas, got %q", RedactURL(u))
		}
	}
	if n.SubjectPrefix == "" || strings.ContainsAny(n.SubjectPrefix, " *>") {
		bad("subject_prefix", "must be a literal subject, got %q", n.SubjectPrefix)
	}
	n.validateWorkers(&p)
	return p.list
}

// validateWorkers checks the embedded server's users: each can log in.
func (n NATS) validateWorkers(p *problems) {
	bad := p.add
	kinds := 0
	for _, set := range []bool{n.CredsFile != "", n.User != "" || n.PasswordFile != "", n.TokenFile != "", n.NKeySeedFile != ""} {
		if set {
			kinds++
		}
	}
	if kinds > 1 {
		bad("creds_file", "set one of creds_file, user with password_file, token_file and nkey_seed_file")
	}
	if (n.User == "") != (n.PasswordFile == "") {
		bad("user", "user and password_file go together")
	}
	if n.Embedded.Sync != SyncAlways && n.Embedded.Sync != SyncPeriodic {
		bad("embedded.sync", "must be always or periodic, got %q", n.Embedded.Sync)
	}
	if (n.Embedded.TLS.CertFile == "") != (n.Embedded.TLS.KeyFile == "") {
		bad("embedded.tls", "cert_file and key_file go together")
	}
	names := map[string]bool{}
	for i, w := range n.Embedded.Workers {
		key := fmt.Sprintf("embedded.workers[%d]", i)
		switch {
		case w.Name == "" || w.Name == SidecarUser || w.Name == WorkerUser:
			bad(key+".name", "must be set and not %q or %q", SidecarUser, WorkerUser)
		case names[w.Name]:
			bad(key+".name", "duplicate user %q", w.Name)
		}
		names[w.Name] = true
		if (w.PasswordFile == "") == (w.NKey == "") {
			bad(key, "set exactly one of password_file and nkey")
		}
		if w.NKey != "" && !strings.HasPrefix(w.NKey, "U") {
			bad(key+".nkey", "must be a public user nkey (U...)")
		}
		if len(w.Tools) == 0 {
			bad(key+".tools", "list the tools the worker may serve (or \"*\")")
		}
	}
}
