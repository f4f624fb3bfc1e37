package sidecar

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/discovery"
	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/wire"
)

// declarations reads the tools that the workers of infos declare in their
// code, under prefix: one per name, sorted by name. When workers declare
// one name differently, the declaration most of them give is taken (on a
// tie, the one of the worker whose ID sorts first) and the others are
// reported. A declaration that does not parse is left out and reported.
func declarations(infos []discovery.ServiceInfo, prefix string) (out []registry.Declared, problems []string) {
	type variant struct {
		decl tool.Declaration
		by   []string
	}
	byName := map[string][]*variant{}
	for _, info := range infos {
		who := fmt.Sprintf("%s worker %s", safeToken(info.Metadata["language"], "a"), safeToken(info.ID, "without an ID"))
		for _, ep := range info.Endpoints {
			raw, declared := ep.Metadata[wire.ToolMetadataKey]
			name, ours := strings.CutPrefix(ep.Subject, prefix+".")
			if !declared || !ours {
				continue
			}
			d, err := tool.ParseDeclaration(name, []byte(raw))
			if err != nil {
				problems = append(problems, fmt.Sprintf("tool %s declared by %s is left out: %v", name, who, err))
				continue
			}
			vs, known := byName[name]
			if !known && len(byName) == maxDeclaredTools {
				problems = append(problems, fmt.Sprintf("tool %s declared by %s is left out: the bus declares more than %d tools", name, who, maxDeclaredTools))
				continue
			}
			i := slices.IndexFunc(vs, func(v *variant) bool { return sameDeclaration(v.decl, d) })
			if i < 0 {
				vs, i = append(vs, &variant{decl: d}), len(vs)
			}
			vs[i].by = append(vs[i].by, who)
			byName[name] = vs
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		vs := byName[name]
		for _, v := range vs {
			slices.Sort(v.by)
		}
		slices.SortFunc(vs, func(a, b *variant) int {
			if len(a.by) != len(b.by) {
				return len(b.by) - len(a.by)
			}
			return strings.Compare(a.by[0], b.by[0])
		})
		for _, v := range vs[1:] {
			problems = append(problems, fmt.Sprintf("tool %s: %s declare it otherwise than %s; the latter's declaration is served",
				name, strings.Join(v.by, ", "), strings.Join(vs[0].by, ", ")))
		}
		out = append(out, registry.Declared{Name: name, Declaration: vs[0].decl, By: vs[0].by})
	}
	return out, problems
}

// maxDeclaredTools bounds the tools the workers on the bus may declare:
// each is compiled into every registry built.
const maxDeclaredTools = 1000

// token is what a worker's language and ID may look like in messages and
// in GET /v1/tools: they come from the bus, from any client.
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

// sameTools reports declared lists that serve the same tools.
func sameTools(a, b []registry.Declared) bool {
	return slices.EqualFunc(a, b, func(x, y registry.Declared) bool {
		return x.Name == y.Name && slices.Equal(x.By, y.By) && sameDeclaration(x.Declaration, y.Declaration)
	})
}

// redeclare puts the tools that the workers declare now in force, with the
// rest of the registry as it is. A declaration that contradicts the
// configuration or does not compile is left out, and logged when it
// appears. It is the discovery loop's step, and the start's.
func (s *Sidecar) redeclare(ctx context.Context) {
	infos, err := discovery.Probe(ctx, s.nc, discovery.DefaultWait)
	if err != nil {
		s.log.Warn("asking the workers for their tools", "err", err)
		return
	}
	decls, problems := declarations(infos, s.cfg.NATS.SubjectPrefix)
	if sameTools(decls, *s.seen) && slices.Equal(problems, s.seenProblems) {
		return // nothing changed since the last look
	}
	s.seen, s.seenProblems = &decls, problems
	for _, p := range problems {
		s.log.Error("a worker's tool declaration", "problem", p)
	}
	before := s.live.Load()
	reg, err := s.live.Update(func(cur *registry.Registry) (*registry.Registry, error) {
		kept := decls
		for {
			reg, err := cur.Redeclare(kept)
			bad := registry.DeclarationErrors(err)
			if err == nil || len(bad) == 0 {
				return reg, err
			}
			for _, de := range bad {
				s.log.Error("a worker's tool declaration is left out", "tool", de.Tool, "err", de)
			}
			n := len(kept)
			kept = slices.DeleteFunc(slices.Clone(kept), func(d registry.Declared) bool {
				return slices.ContainsFunc(bad, func(de *registry.DeclarationError) bool { return de.Tool == d.Name })
			})
			if len(kept) == n {
				return nil, err
			}
		}
	})
	if err != nil {
		s.log.Error("the workers' tools are not put in force", "err", err)
		return
	}
	added, gone := diffNames(before.Names(), reg.Names())
	s.log.Info("workers' tools in force", "declared", len(reg.Declared()), "added", added, "gone", gone)
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
// bus declare. Unlike a later discovery, which leaves a bad declaration
// out, a declaration that contradicts the configuration fails the start:
// the operator sees both sources before anything is served. An embedded
// server has no worker yet; discovery finds them once they connect.
func (s *Sidecar) declaredAtStart(ctx context.Context, reg *registry.Registry) (*registry.Registry, error) {
	s.seen = &[]registry.Declared{}
	if s.cfg.NATS.URL == "" || s.cfg.NATS.DiscoverInterval <= 0 {
		return reg, nil
	}
	decls, problems, err := probeDeclarations(ctx, s.nc, s.cfg.NATS.SubjectPrefix)
	if err != nil {
		return nil, err
	}
	for _, p := range problems {
		s.log.Error("a worker's tool declaration", "problem", p)
	}
	if reg, err = reg.Redeclare(decls); err != nil {
		return nil, err
	}
	s.seen, s.seenProblems = &decls, problems
	return reg, nil
}

// probeDeclarations asks the workers on nc's bus for the tools they declare.
func probeDeclarations(ctx context.Context, nc *nats.Conn, prefix string) ([]registry.Declared, []string, error) {
	infos, err := discovery.Probe(ctx, nc, discovery.DefaultWait)
	if err != nil {
		return nil, nil, err
	}
	decls, problems := declarations(infos, prefix)
	return decls, problems, nil
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
	cc := connectConfig(cfg.NATS, cfg.NATS.URL, "toolsidecar-check")
	cc.FirstTry = 2 * time.Second
	if err := readNATSSecrets(cfg.NATS, &cc); err != nil {
		return nil, nil, false, &BusError{err}
	}
	nc, err := bridge.Connect(ctx, cc, nil, nil)
	if err != nil {
		return nil, nil, false, &BusError{err}
	}
	defer nc.Close()
	decls, problems, err := probeDeclarations(ctx, nc, cfg.NATS.SubjectPrefix)
	if err != nil {
		return nil, nil, false, &BusError{err}
	}
	reg, err = reg.Redeclare(decls)
	return reg, problems, true, err
}

// BusError is a bus that Redeclared could not ask: its secrets, its
// connection or its answers.
type BusError struct{ Err error }

func (e *BusError) Error() string { return "asking the workers on NATS: " + e.Err.Error() }
func (e *BusError) Unwrap() error { return e.Err }
