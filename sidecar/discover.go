package sidecar

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/discovery"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

// The bus is a trust boundary: any client of it may answer $SRV.INFO, as
// often and with what it likes. Discovery therefore takes only names from
// those answers, and each tool's declaration from a describe request on
// the tool's own subject, which NATS delivers only to the workers its
// permissions let serve the tool (discovery.Describe). No answer outvotes
// another: the first declaration of a tool stays in force while it is
// served, and a worker that declares it otherwise is a conflict, reported.

// Bounds of discovery, whatever the bus sends.
const (
	// maxDeclaredTools bounds the tools served from workers' code: each is
	// compiled into every registry built. A tool in force is never evicted
	// for a new one.
	maxDeclaredTools = 1000
	// maxFreshPerLook bounds the names not in force that one look asks
	// to describe.
	maxFreshPerLook = 1000
	// describeWait bounds a look's describe requests: it ends as soon as
	// every one is answered (no responders included), so only a worker
	// that holds a subscription and does not answer makes a look wait it
	// whole.
	describeWait = time.Second
	// maxReported bounds the problems remembered as reported, so that
	// each is logged once; past it, the memory starts again.
	maxReported = 10000
)

// Why a declaration is left out: the reason label of
// toolsidecar_declarations_left_out_total.
const (
	leftInvalid    = "invalid"     // does not parse
	leftConflict   = "conflict"    // another permitted worker declared it first
	leftNotAllowed = "not_allowed" // outside nats.discover_allow
	leftOverCap    = "over_cap"    // the bus declares more than maxDeclaredTools
	leftRefused    = "refused"     // contradicts the configuration, or does not compile
	leftRepeated   = "repeated"    // a worker answered one describe request again
	leftOverBytes  = "over_bytes"  // the look's declarations passed discovery.MaxDescribeBytes
)

// declaredTool is a tool a worker declares, as discovery keeps it.
type declaredTool struct {
	registry.Declared
	// seen is when a worker that may serve it last gave its declaration.
	seen time.Time
	// refused: the registry left it out (it contradicts the configuration
	// or does not compile); it is not offered again until it changes.
	refused bool
}

// busTools is what discovery knows of the tools workers declare. The
// start and then the discovery loop use it, one after the other.
type busTools struct {
	prefix   string
	grace    time.Duration
	wait     time.Duration // bounds a look's describe requests: describeWait
	allows   func(name string) bool
	tools    map[string]*declaredTool
	reported map[string]bool
	leftOut  *prometheus.CounterVec
}

// newBusTools is discovery's state for the configuration n; leftOut counts
// the declarations left out, by reason (nil: not counted).
func newBusTools(n config.NATS, leftOut *prometheus.CounterVec) *busTools {
	return &busTools{prefix: n.SubjectPrefix, grace: n.DiscoverGrace, wait: describeWait, allows: n.DiscoverAllows,
		tools: map[string]*declaredTool{}, reported: map[string]bool{}, leftOut: leftOut}
}

// newLeftOutCounter registers toolsidecar_declarations_left_out_total.
func newLeftOutCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "declarations_left_out_total",
		Help: "Tool declarations of workers that discovery left out, by reason (invalid, conflict, not_allowed, over_cap, refused, repeated, over_bytes)."}, []string{"reason"})
	for _, r := range []string{leftInvalid, leftConflict, leftNotAllowed, leftOverCap, leftRefused, leftRepeated, leftOverBytes} {
		c.WithLabelValues(r)
	}
	reg.MustRegister(c)
	return c
}

// look asks the bus once: the names its services announce, then every
// tool in force and every new name for its declaration. It reports
// whether the tools in force changed, and the problems not reported
// before.
func (b *busTools) look(ctx context.Context, nc *nats.Conn, now time.Time) (changed bool, problems []string, err error) {
	infos, err := discovery.Probe(ctx, nc, discovery.DefaultWait)
	if err != nil {
		return false, nil, err
	}
	ask := slices.Sorted(maps.Keys(b.tools))
	fresh, problems := b.announced(infos)
	ask = append(ask, fresh...)
	subjects := make([]string, len(ask))
	for i, name := range ask {
		subjects[i] = wire.Subject(b.prefix, name)
	}
	got, err := discovery.Describe(ctx, nc, subjects, len(b.tools), b.wait, tool.MaxDeclarationBytes)
	if err != nil {
		return false, nil, err
	}
	for i, name := range ask {
		c, p := b.answered(name, got[i], now)
		changed = changed || c
		problems = append(problems, p...)
	}
	return changed, b.unreported(problems), nil
}

// announced lists the names that the services of infos announce under the
// prefix, not in force yet, that the allow-list lets in: at most
// maxFreshPerLook, drawn at random, so that names nobody serves (any bus
// client may announce them) cannot keep a served one out for good.
func (b *busTools) announced(infos []discovery.ServiceInfo) (fresh []string, problems []string) {
	seen := map[string]bool{}
	for _, info := range infos {
		for _, ep := range info.Endpoints {
			name, ours := strings.CutPrefix(ep.Subject, b.prefix+".")
			if _, declared := ep.Metadata[wire.ToolMetadataKey]; !declared || !ours || !tool.ValidName(name) || seen[name] || b.tools[name] != nil {
				continue
			}
			seen[name] = true
			if !b.allows(name) {
				problems = append(problems, b.leave(leftNotAllowed, "tool %s is declared on the bus but not in nats.discover_allow: left out", name))
				continue
			}
			fresh = append(fresh, name)
		}
	}
	if len(fresh) > maxFreshPerLook {
		rand.Shuffle(len(fresh), func(i, j int) { fresh[i], fresh[j] = fresh[j], fresh[i] })
		fresh = fresh[:maxFreshPerLook]
	}
	return fresh, problems
}

// answered applies what the workers of one tool answered its describe
// request. A tool in force stays while a worker answers for it, and
// through a silence shorter than the grace; it leaves at once when nobody
// serves its subject. A new tool comes in with the first valid answer.
func (b *busTools) answered(name string, d discovery.Described, now time.Time) (changed bool, problems []string) {
	if d.Repeats > 0 {
		// Logged once, whatever the count: the answers are the bus's.
		b.countN(leftRepeated, d.Repeats)
		problems = append(problems, fmt.Sprintf("tool %s: a worker answered its describe request more than once; the answers after the first are dropped", name))
	}
	if d.Cut {
		problems = append(problems, b.leave(leftOverBytes, "tool %s is not read this look: the declarations of one look passed %d bytes", name, discovery.MaxDescribeBytes))
	}
	var valid []registry.Declared
	for _, a := range d.Answers {
		who := workerName(a.Worker)
		decl, err := tool.ParseDeclaration(name, a.Declaration)
		if err != nil {
			problems = append(problems, b.leave(leftInvalid, "tool %s declared by %s is left out: %v", name, who, err))
			continue
		}
		valid = append(valid, registry.Declared{Name: name, Declaration: decl, By: []string{who}})
	}
	cur := b.tools[name]
	switch {
	case cur == nil && len(valid) == 0:
		return false, problems
	case cur == nil && len(b.tools) >= maxDeclaredTools:
		return false, append(problems, b.leave(leftOverCap, "tool %s is left out: the workers declare more than %d tools", name, maxDeclaredTools))
	case cur == nil || cur.refused && len(valid) > 0 && !sameDeclaration(cur.Declaration, valid[0].Declaration):
		cur = &declaredTool{Declared: valid[0]}
		b.tools[name], changed = cur, true
	case len(valid) == 0:
		if d.NoResponders || now.Sub(cur.seen) > b.grace {
			delete(b.tools, name)
			return !cur.refused, problems
		}
		return false, problems
	}
	cur.seen = now
	for _, v := range valid {
		if !sameDeclaration(cur.Declaration, v.Declaration) {
			problems = append(problems, b.leave(leftConflict, "tool %s: %s declares it otherwise than %s, whose declaration stays in force",
				name, v.By[0], strings.Join(cur.By, ", ")))
		}
	}
	return changed, problems
}

// leave counts a declaration left out for reason, and says why.
func (b *busTools) leave(reason, format string, args ...any) string {
	b.count(reason)
	return fmt.Sprintf(format, args...)
}

// count counts a declaration left out for reason.
func (b *busTools) count(reason string) { b.countN(reason, 1) }

// countN counts n declarations left out for reason.
func (b *busTools) countN(reason string, n int) {
	if b.leftOut != nil {
		b.leftOut.WithLabelValues(reason).Add(float64(n))
	}
}

// unreported keeps the problems not reported before, and remembers them.
func (b *busTools) unreported(problems []string) []string {
	var out []string
	for _, p := range problems {
		if b.reported[p] {
			continue
		}
		if len(b.reported) == maxReported {
			clear(b.reported)
		}
		b.reported[p] = true
		out = append(out, p)
	}
	return out
}

// declared are the declarations in force that the registry has not
// refused, sorted by name.
func (b *busTools) declared() []registry.Declared {
	var out []registry.Declared
	for _, name := range slices.Sorted(maps.Keys(b.tools)) {
		if t := b.tools[name]; !t.refused {
			out = append(out, t.Declared)
		}
	}
	return out
}

// refuse marks the declarations the registry left out; they are not
// offered to it again until they change.
func (b *busTools) refuse(bad []*registry.DeclarationError) {
	for _, de := range bad {
		if t := b.tools[de.Tool]; t != nil && !t.refused {
			t.refused = true
			b.count(leftRefused)
		}
	}
}

// workerName is how a worker names itself in its describe answer
// ("go <id>"), as messages show it: the answer comes from the bus.
func workerName(header string) string {
	lang, id, _ := strings.Cut(header, " ")
	return fmt.Sprintf("%s worker %s", safeToken(lang, "a"), safeToken(id, "without an ID"))
}

// token is what a worker's language and ID may look like in messages and
// in GET /v1/tools: they come from the bus.
var token = regexp.MustCompile(`^[A-Za-z0-9_.+-]{1,64}$`)

// safeToken is s when it looks like a token, else alt.
func safeToken(s, alt string) string {
	if token.MatchString(s) {
		return s
	}
	return alt
}

// sameDeclaration compares declarations whose schemas differ only in
// their JSON's spacing or key order, as libraries in other languages
// print them.
func sameDeclaration(a, b tool.Declaration) bool {
	pa, pb := a.Parameters, b.Parameters
	a.Parameters, b.Parameters = nil, nil
	return reflect.DeepEqual(a, b) && tool.SameJSON(pa, pb)
}

// redeclare looks at the bus once and puts the tools that the workers
// declare in force, with the rest of the registry as it is. A declaration
// that contradicts the configuration or does not compile is left out, and
// logged once. It is the discovery loop's step, and the start's.
func (s *Sidecar) redeclare(ctx context.Context) {
	changed, problems, err := s.bus.look(ctx, s.nc, time.Now())
	if err != nil {
		s.log.Warn("asking the workers for their tools", "err", err)
		return
	}
	for _, p := range problems {
		s.log.Error("a worker's tool declaration", "problem", p)
	}
	if !changed {
		return
	}
	before := s.live.Load()
	reg, err := s.live.Update(func(cur *registry.Registry) (*registry.Registry, error) {
		reg, bad, err := s.bus.compile(cur)
		for _, de := range bad {
			s.log.Error("a worker's tool declaration is left out", "tool", de.Tool, "err", de)
		}
		return reg, err
	})
	if err != nil {
		s.log.Error("the workers' tools are not put in force", "err", err)
		return
	}
	for _, c := range s.bus.conflicts(reg) {
		s.log.Error("a worker's tool declaration is left out", "tool", c.Tool, "err", c)
	}
	added, gone := diffNames(before.Names(), reg.Names())
	s.log.Info("workers' tools in force", "declared", len(reg.Declared()), "added", added, "gone", gone)
}

// conflicts are reg's declarations that the configuration contradicts
// (its entry is in force, they are left out), each counted and returned
// once: discovery compiles again whenever any tool changes.
func (b *busTools) conflicts(reg *registry.Registry) []*registry.DeclarationError {
	var out []*registry.DeclarationError
	for _, c := range reg.Conflicts() {
		if len(b.unreported([]string{c.Error()})) > 0 {
			b.count(leftRefused)
			out = append(out, c)
		}
	}
	return out
}

// compile is reg with the declarations in force, leaving out (and
// refusing from now on) those the registry cannot take: left.
func (b *busTools) compile(reg *registry.Registry) (_ *registry.Registry, left []*registry.DeclarationError, err error) {
	for {
		next, err := reg.Redeclare(b.declared())
		bad := registry.DeclarationErrors(err)
		if err == nil || len(bad) == 0 {
			return next, left, err
		}
		left = append(left, bad...)
		b.refuse(bad)
	}
}

// diffNames lists the names only in after, and those only in before.
func diffNames(before, after []string) (added, gone []string) {
	for _, n := range after {
		if !slices.Contains(before, n) {
			added = append(added, n)
		}
	}
	for _, n := range before {
		if !slices.Contains(after, n) {
			gone = append(gone, n)
		}
	}
	return added, gone
}

// discover keeps the registry's declared tools those of the workers on the
// bus, looking every interval until ctx ends.
func (s *Sidecar) discover(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.redeclare(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// declaredAtStart adds the tools that the workers already on an external
// bus declare. A declaration that contradicts the configuration is left
// out with an error, as a later discovery and a reload leave it out: no
// bus client can keep the sidecar from starting. An embedded server has no worker
// yet; discovery finds them once they connect.
func (s *Sidecar) declaredAtStart(ctx context.Context, reg *registry.Registry) (*registry.Registry, error) {
	s.bus = newBusTools(s.cfg.NATS, newLeftOutCounter(s.metrics))
	if s.cfg.NATS.URL == "" || s.cfg.NATS.DiscoverInterval <= 0 {
		return reg, nil
	}
	_, problems, err := s.bus.look(ctx, s.nc, time.Now())
	if err != nil {
		return nil, err
	}
	for _, p := range problems {
		s.log.Warn("a worker's tool declaration", "problem", p)
	}
	reg, bad, err := s.bus.compile(reg)
	if err != nil {
		return nil, err
	}
	for _, de := range append(bad, s.bus.conflicts(reg)...) {
		s.log.Error("a worker's tool declaration is left out", "tool", de.Tool, "err", de)
	}
	return reg, nil
}

// Redeclared is reg with the tools that the workers on the configuration's
// external bus declare, read as a start reads them, for `toolsidecar
// check` and `toolsidecar tools`; problems are the declarations left out.
// With the embedded server (it starts with the sidecar, so no worker is
// on it) or discovery off, it is reg, and read is false.
func Redeclared(ctx context.Context, cfg config.Config, reg *registry.Registry) (_ *registry.Registry, problems []string, read bool, err error) {
	if cfg.NATS.URL == "" || cfg.NATS.DiscoverInterval <= 0 {
		return reg, nil, false, nil
	}
	nc, err := checkConnect(ctx, cfg.NATS)
	if err != nil {
		return nil, nil, false, err
	}
	defer nc.Close()
	bus := newBusTools(cfg.NATS, nil)
	if _, problems, err = bus.look(ctx, nc, time.Now()); err != nil {
		return nil, nil, false, &BusError{err}
	}
	reg, bad, err := bus.compile(reg)
	if err != nil {
		return nil, nil, false, err
	}
	for _, de := range append(bad, reg.Conflicts()...) {
		problems = append(problems, de.Error())
	}
	return reg, problems, true, nil
}

// checkConnect connects `toolsidecar check` to the external bus, trying
// for 2 s: check may run away from where the daemon runs.
func checkConnect(ctx context.Context, n config.NATS) (*nats.Conn, error) {
	cc := connectConfig(n, n.URL, "toolsidecar-check")
	cc.FirstTry = 2 * time.Second
	if err := readNATSSecrets(n, &cc); err != nil {
		return nil, &BusError{err}
	}
	nc, err := bridge.Connect(ctx, cc, nil, nil)
	if err != nil {
		return nil, &BusError{err}
	}
	return nc, nil
}

// BusError is a bus that Redeclared could not ask: its secrets, its
// connection or its answers.
type BusError struct{ Err error }

func (e *BusError) Error() string { return "asking the workers on NATS: " + e.Err.Error() }
func (e *BusError) Unwrap() error { return e.Err }
