// Command loadgen measures toolsidecar under load. It builds and starts the
// sidecar (embedded NATS) and the Core simulator as processes of their own,
// serves the tool from a worker process (itself, with -worker), then, at
// each level of concurrency asked for, sets up that many runs and drives
// them all at once through the sidecar's HTTP API. Each run is one batch of
// -calls calls of a tool that takes -latency, then the final answer. It
// prints, per level: throughput, run time percentiles, errors, Core
// requests per call, the sidecar's peak RSS, goroutines, stacks and heap,
// its collections, and the most requests it had queued for Core; and it
// writes the run time and RSS against concurrency as an SVG plot.
//
//	cd loadgen && go run . -levels 1,10,100,1000 -plot ../docs/loadgen.svg
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

const apiKey = "loadgen"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

type options struct {
	root    string
	levels  []int
	calls   int
	latency time.Duration
	durable bool
	h2c     bool
	plot    string
	jsonOut string
	heap    string
	heapAt  time.Duration
	cpuFor  time.Duration
	cpuProf string
	// sidecarCgroup: the sidecar joins it before it starts
	sidecarCgroup string
	sidecarEnv    string
	maxLevel      int
}

func run() error {
	var o options
	levels := flag.String("levels", "1,10,100,1000", "concurrent runs at each level, comma-separated")
	flag.StringVar(&o.root, "root", "..", "the toolsidecar repository")
	flag.IntVar(&o.calls, "calls", 4, "calls per batch")
	flag.DurationVar(&o.latency, "latency", time.Second, "how long the tool takes")
	flag.BoolVar(&o.durable, "durable", false, "durable mode (JetStream ledger)")
	flag.BoolVar(&o.h2c, "h2c", false, "drive over HTTP/2 without TLS (server.http2_cleartext), many drives per connection, instead of HTTP/1.1")
	flag.StringVar(&o.plot, "plot", "", "write the plot to this SVG file")
	flag.StringVar(&o.jsonOut, "json", "", "write the results to this JSON file")
	flag.StringVar(&o.heap, "heap", "", "write the sidecar's heap profile, taken -heap-at into the last level, to this file, and its goroutines to FILE.goroutines (server.pprof)")
	flag.StringVar(&o.cpuProf, "cpuprofile", "", "write a CPU profile of the sidecar, -cpuprofile-for from the start of the last level (after -heap's), to this file (server.pprof)")
	flag.DurationVar(&o.cpuFor, "cpuprofile-for", 5*time.Second, "with -cpuprofile: how long the profile runs (whole seconds)")
	flag.DurationVar(&o.heapAt, "heap-at", 2*time.Second, "with -heap: when, into the last level, the profiles are taken")
	flag.StringVar(&o.sidecarCgroup, "sidecar-cgroup", "", "run the sidecar in this existing cgroup directory (for instance a memory cgroup with a limit, as a container's; needs the right to write its cgroup.procs)")
	flag.StringVar(&o.sidecarEnv, "sidecar-env", "", "extra environment of the sidecar process, comma-separated KEY=VALUE (e.g. GOMEMLIMIT=96MiB)")
	workerURL := flag.String("worker", "", "serve the tool on this NATS URL (the worker process)")
	concurrency := flag.Int("concurrency", 1024, "with -worker: calls at once")
	flag.Parse()
	if *workerURL != "" {
		return serveWorker(*workerURL, *concurrency, o.latency)
	}
	for f := range strings.SplitSeq(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-levels: %q is not a positive number", f)
		}
		o.levels = append(o.levels, n)
		o.maxLevel = max(o.maxLevel, n)
	}
	return measure(o)
}

// serveWorker is the worker process: the tool sleeps for latency.
func serveWorker(url string, concurrency int, latency time.Duration) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	w := worker.New(nc, "toolsidecar.tools", worker.WithConcurrency(concurrency))
	w.Handle("work", func(ctx context.Context, c *tool.Call) ([]byte, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(latency):
		}
		return []byte(`{"done": true}`), nil
	})
	if err := w.Start(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return w.Stop(context.Background())
}

// stack is the processes under test.
type stack struct {
	procs   []*exec.Cmd
	sidecar *exec.Cmd
	coresim *exec.Cmd
	worker  *exec.Cmd
	api     string // the sidecar's API, http://host:port
	ops     string // its ops listener
	core    *core.Client
	tools   []core.FunctionTool
}

func (s *stack) stop() {
	for _, p := range slices.Backward(s.procs) {
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
}

func measure(o options) error {
	tmp, err := os.MkdirTemp("", "loadgen")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	s, err := start(o, tmp)
	if s != nil {
		defer s.stop()
	}
	if err != nil {
		return err
	}
	fmt.Printf("toolsidecar under load: %d calls of %s per run, then a final turn; durable=%v h2c=%v\n", o.calls, o.latency, o.durable, o.h2c)
	fmt.Printf("%8s %10s %9s %9s %9s %7s %10s %9s %11s %10s %9s %6s %11s %15s\n", "runs", "calls/s", "p50", "p99", "max", "errors", "core req/call", "RSS MiB",
		"goroutines", "stack MiB", "heap MiB", "GCs", "core queue", "core conns/run")
	var results []result
	for _, n := range o.levels {
		r, err := s.level(n, o)
		if err != nil {
			return fmt.Errorf("%d runs: %w", n, err)
		}
		results = append(results, r)
		fmt.Printf("%8d %10.0f %9s %9s %9s %7d %13.2f %9.1f %11d %10.1f %9.1f %6d %11d %15.2f\n", r.Runs, r.CallsPerSec, r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond),
			r.Max.Round(time.Millisecond), r.Errors, r.CoreRequestsPerCall, r.PeakRSSMiB, r.PeakGoroutines, r.PeakStackMiB, r.PeakHeapMiB, r.GCs, r.PeakCoreQueue, r.CoreConnsPerRun)
		if c := r.CPUPerCall; r.Calls >= minCPUCalls {
			fmt.Printf("%8s CPU per call: sidecar %d µs, Core %d µs, worker %d µs, loadgen %d µs\n", "", c.Sidecar.Microseconds(), c.Core.Microseconds(),
				c.Worker.Microseconds(), c.Loadgen.Microseconds())
		}
		if o.durable && r.LeaseRenewalMean > 0 {
			fmt.Printf("%8s lease renewals: %s on average; %d leases lapsed under their drives\n", "", r.LeaseRenewalMean.Round(time.Millisecond), r.LeasesExpired)
		}
		if r.FirstError != "" {
			fmt.Printf("%8s first error: %s\n", "", r.FirstError)
		}
	}
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	if o.plot != "" {
		if err := plotResults(o.plot, results, o); err != nil {
			return err
		}
		fmt.Println("plot written to", o.plot)
	}
	return nil
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// start builds the binaries and starts the simulator, the sidecar and the
// worker, and waits until the sidecar sees the worker.
func start(o options, tmp string) (*stack, error) {
	for _, cmd := range []string{"toolsidecar", "coresim"} {
		b := exec.Command("go", "build", "-o", filepath.Join(tmp, cmd), "./cmd/"+cmd)
		b.Dir, b.Stderr = o.root, os.Stderr
		if err := b.Run(); err != nil {
			return nil, fmt.Errorf("building %s: %w", cmd, err)
		}
	}
	var sc bytes.Buffer
	sc.WriteString("turns:\n  - calls:\n")
	for i := range o.calls {
		fmt.Fprintf(&sc, "      - {tool: work, args_json: '{\"i\": %d}'}\n", i)
	}
	sc.WriteString("  - content: done\n")
	scenario := filepath.Join(tmp, "scenario.yaml")
	if err := os.WriteFile(scenario, sc.Bytes(), 0o600); err != nil {
		return nil, err
	}
	coreAddr, apiAddr, opsAddr, natsAddr := freeAddr(), freeAddr(), freeAddr(), freeAddr()
	cfg := fmt.Sprintf(`durability: {enabled: %v}
core: {url: "http://%s", timeout: 60s}
nats:
  embedded: {listen: %q, allow_anonymous: true, store_dir: %q}
server: {listen: %q, ops_listen: %q, pprof: true, proxy: false, max_drives: %d, max_connections: %d, read_timeout: 10m, http2_cleartext: %v}
executor: {max_parallel: %d}
tools:
  - {name: work, side_effects: read_only, timeout: 60s}
`, o.durable, coreAddr, natsAddr, filepath.Join(tmp, "jetstream"), apiAddr, opsAddr, o.maxLevel+16, o.maxLevel+64, o.h2c, max(16, o.calls))
	cfgPath := filepath.Join(tmp, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	s := &stack{api: "http://" + apiAddr, ops: "http://" + opsAddr}
	launch := func(name string, env []string, args ...string) (*exec.Cmd, error) {
		c := exec.Command(name, args...)
		c.Env = append(os.Environ(), env...)
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			return nil, err
		}
		s.procs = append(s.procs, c)
		return c, nil
	}
	var err error
	if s.coresim, err = launch(filepath.Join(tmp, "coresim"), nil, "--listen", coreAddr, "--scenario", scenario); err != nil {
		return s, err
	}
	sidecarEnv := []string{"TOOLSIDECAR_CORE_API_KEY=" + apiKey}
	if o.sidecarEnv != "" {
		sidecarEnv = append(sidecarEnv, strings.Split(o.sidecarEnv, ",")...)
	}
	sidecarCmd := []string{filepath.Join(tmp, "toolsidecar"), "run", "--config", cfgPath, "--log-level", "error"}
	if o.sidecarCgroup != "" {
		// The shell joins the cgroup and becomes the sidecar (same pid),
		// which reads its limit as it starts.
		sidecarCmd = append([]string{"/bin/sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, o.sidecarCgroup}, sidecarCmd...)
	}
	if s.sidecar, err = launch(sidecarCmd[0], sidecarEnv, sidecarCmd[1:]...); err != nil {
		return s, err
	}
	if err := waitHTTP(s.ops+"/readyz", 30*time.Second); err != nil {
		return s, fmt.Errorf("the sidecar did not become ready: %w", err)
	}
	self, _ := os.Executable()
	if s.worker, err = launch(self, nil, "-worker", "nats://"+natsAddr, "-concurrency", strconv.Itoa(o.maxLevel*o.calls+16),
		"-latency", o.latency.String()); err != nil {
		return s, err
	}
	if s.core, err = core.New(core.Config{URL: "http://" + coreAddr, APIKey: apiKey, Timeout: 60 * time.Second}); err != nil {
		return s, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var tools []core.FunctionTool
		if resp, err := http.Get(s.api + "/v1/tools?live=1"); err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&tools)
			resp.Body.Close()
		}
		if len(tools) == 1 {
			s.tools = tools
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, errors.New("the worker never appeared to the sidecar")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitHTTP(url string, within time.Duration) error {
	return waitHTTPWith(http.DefaultClient, url, within)
}

// waitHTTPWith waits, through client, until url answers 200.
func waitHTTPWith(client *http.Client, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// result is one level's figures.
type result struct {
	Runs                int           `json:"runs"`
	Calls               int           `json:"calls"`
	Wall                time.Duration `json:"wall_ns"`
	CallsPerSec         float64       `json:"calls_per_sec"`
	P50                 time.Duration `json:"p50_ns"`
	P99                 time.Duration `json:"p99_ns"`
	Max                 time.Duration `json:"max_ns"`
	Errors              int           `json:"errors"`
	FirstError          string        `json:"first_error,omitempty"`
	CoreRequestsPerCall float64       `json:"core_requests_per_call"`
	PeakRSSMiB          float64       `json:"peak_rss_mib"`
	PeakGoroutines      int           `json:"peak_goroutines"`
	PeakStackMiB        float64       `json:"peak_stack_mib"`
	PeakHeapMiB         float64       `json:"peak_heap_mib"`
	// GCs counts the sidecar's collections during the level.
	GCs int `json:"gc_cycles"`
	// PeakCoreQueue is the most requests to Core seen waiting for a
	// connection (toolsidecar_core_requests_queued): Core-bound when high.
	PeakCoreQueue int `json:"peak_core_queue"`
	// CoreConnsPerRun counts the connections the sidecar opened to Core,
	// per run (toolsidecar_core_connections_opened_total).
	CoreConnsPerRun float64 `json:"core_connections_per_run"`
	// In durable mode: the mean time of a renewal of the sidecar's lease
	// key, and the leases whose holder's key lapsed under their drives.
	LeaseRenewalMean time.Duration `json:"lease_renewal_mean_ns,omitempty"`
	LeasesExpired    int           `json:"leases_expired,omitempty"`
	// CPUPerCall is the CPU time (user and system) each process used
	// during the level, per call: on a machine whose cores they share, it
	// says which of them bounds the throughput.
	CPUPerCall cpuSplit `json:"cpu_per_call_ns"`
}

// minCPUCalls is the fewest calls of a level whose CPU per call is
// printed: /proc counts in ticks of 10 ms, too coarse for a few calls.
const minCPUCalls = 400

// cpuSplit is a CPU time for each process of the stack.
type cpuSplit struct {
	Sidecar time.Duration `json:"sidecar"`
	Core    time.Duration `json:"core"`
	Worker  time.Duration `json:"worker"`
	Loadgen time.Duration `json:"loadgen"`
}

// cpu reads the CPU time each process has used so far.
func (s *stack) cpu() cpuSplit {
	return cpuSplit{Sidecar: cpuTime(s.sidecar.Process.Pid), Core: cpuTime(s.coresim.Process.Pid), Worker: cpuTime(s.worker.Process.Pid), Loadgen: cpuTime(os.Getpid())}
}

// perCall is the CPU each process used from c to after, per call.
func (c cpuSplit) perCall(after cpuSplit, calls int) cpuSplit {
	per := func(a, b time.Duration) time.Duration { return (b - a) / time.Duration(calls) }
	return cpuSplit{Sidecar: per(c.Sidecar, after.Sidecar), Core: per(c.Core, after.Core), Worker: per(c.Worker, after.Worker), Loadgen: per(c.Loadgen, after.Loadgen)}
}

// cpuTime is a process's user and system CPU time so far, from
// /proc/PID/stat (Linux), whose fields 14 and 15 count clock ticks of
// 1/100 s (USER_HZ, 100 on the architectures Go builds for).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * (time.Second / 100)
}

// counted are the sidecar's counters a level reads before and after.
type counted struct{ coreRequests, gcs, coreConns, leaseRenewals, leaseRenewalSeconds, leasesExpired float64 }

func (s *stack) counters() counted {
	m, _ := s.metrics("toolsidecar_core_request_duration_seconds_count", "go_gc_duration_seconds_count",
		"toolsidecar_core_connections_opened_total", "toolsidecar_lease_renewal_seconds_count",
		"toolsidecar_lease_renewal_seconds_sum", "toolsidecar_leases_expired_total")
	return counted{coreRequests: m["toolsidecar_core_request_duration_seconds_count"], gcs: m["go_gc_duration_seconds_count"],
		coreConns: m["toolsidecar_core_connections_opened_total"], leaseRenewals: m["toolsidecar_lease_renewal_seconds_count"],
		leaseRenewalSeconds: m["toolsidecar_lease_renewal_seconds_sum"], leasesExpired: m["toolsidecar_leases_expired_total"]}
}

// level sets up n runs, drives them all at once and measures.
func (s *stack) level(n int, o options) (result, error) {
	ctx := context.Background()
	runs := make([]coresim.RunRef, n)
	var setupErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range runs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r, err := coresim.SetUpRun(ctx, s.core, s.tools)
			mu.Lock()
			defer mu.Unlock()
			runs[i], setupErr = r, errors.Join(setupErr, err)
		})
	}
	wg.Wait()
	if setupErr != nil {
		return result{}, setupErr
	}
	before, cpuBefore := s.counters(), s.cpu()
	stopSampling := s.sample()
	tr := &http.Transport{MaxIdleConnsPerHost: n, IdleConnTimeout: time.Minute}
	if o.h2c {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Minute}
	if o.h2c {
		// One connection first: the drives then share it, and those past
		// its stream limit open more, rather than each dialing its own.
		if err := waitHTTPWith(client, s.api+"/healthz", 10*time.Second); err != nil {
			return result{}, err
		}
	}
	lat := make([]time.Duration, n)
	var errCount atomic.Int32
	var firstErr atomic.Value
	start := time.Now()
	for i, r := range runs {
		wg.Go(func() {
			t0 := time.Now()
			err := drive(client, s.api, r, o.calls)
			lat[i] = time.Since(t0)
			if err != nil {
				errCount.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		})
	}
	if o.heap != "" && n == o.levels[len(o.levels)-1] {
		time.Sleep(o.heapAt)
		if err := s.saveHeap(o.heap); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: heap profile:", err)
		}
	}
	if o.cpuProf != "" && n == o.levels[len(o.levels)-1] {
		if err := s.saveProfiles(map[string]string{fmt.Sprintf("profile?seconds=%d", max(1, int(o.cpuFor.Seconds()))): o.cpuProf}); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: CPU profile:", err)
		}
	}
	wg.Wait()
	wall := time.Since(start)
	p := stopSampling()
	client.CloseIdleConnections()
	after, cpuAfter := s.counters(), s.cpu()
	slices.Sort(lat)
	r := result{Runs: n, Calls: n * o.calls, Wall: wall, CallsPerSec: float64(n*o.calls) / wall.Seconds(), P50: lat[n/2], P99: lat[min(n-1, n*99/100)],
		Max: lat[n-1], Errors: int(errCount.Load()), CoreRequestsPerCall: (after.coreRequests - before.coreRequests) / float64(n*o.calls),
		PeakRSSMiB: p.rssMiB, PeakGoroutines: p.goroutines, PeakStackMiB: p.stackMiB, PeakHeapMiB: p.heapMiB, GCs: int(after.gcs - before.gcs),
		PeakCoreQueue: p.coreQueue, CoreConnsPerRun: (after.coreConns - before.coreConns) / float64(n), CPUPerCall: cpuBefore.perCall(cpuAfter, n*o.calls)}
	if renewals := after.leaseRenewals - before.leaseRenewals; renewals > 0 {
		r.LeaseRenewalMean = time.Duration((after.leaseRenewalSeconds - before.leaseRenewalSeconds) / renewals * float64(time.Second))
		r.LeasesExpired = int(after.leasesExpired - before.leasesExpired)
	}
	if e, ok := firstErr.Load().(string); ok {
		r.FirstError = e
	}
	return r, nil
}

// drive drives one run through the sidecar's API and checks its summary.
func drive(client *http.Client, api string, r coresim.RunRef, calls int) error {
	body, _ := json.Marshal(r.DriveBody())
	req, _ := http.NewRequest(http.MethodPost, api+"/v1/runs/"+r.RunID+"/drive", bytes.NewReader(body))
	req.Header.Set("X-API-Key", apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var sum struct {
		Status string `json:"status"`
		Calls  []struct {
			OK        bool   `json:"ok"`
			ErrorType string `json:"error_type"`
			Error     string `json:"error"`
		} `json:"calls"`
		Error string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&sum); err != nil {
		return fmt.Errorf("status %d: %w", resp.StatusCode, err)
	}
	ok, why := 0, sum.Error
	for _, c := range sum.Calls {
		if c.OK {
			ok++
		} else if why == "" {
			why = c.ErrorType + ": " + c.Error // the first failed call says why
		}
	}
	if resp.StatusCode != 200 || sum.Status != "completed" || ok != calls {
		return fmt.Errorf("status %d, run %s, %d of %d calls ok: %s", resp.StatusCode, sum.Status, ok, calls, why)
	}
	return nil
}

// peaks are the highest readings of one level.
type peaks struct {
	rssMiB, stackMiB, heapMiB float64
	goroutines, coreQueue     int
}

// sample reads the sidecar's RSS every 100 ms, and its goroutines, stack
// and heap in use and Core queue every second, until the returned func is
// called, which returns the peaks.
func (s *stack) sample() func() peaks {
	stop := make(chan struct{})
	var peakRSS, peakG, peakStack, peakHeap, peakQueue atomic.Int64
	keepMax := func(v *atomic.Int64, x int64) {
		if x > v.Load() {
			v.Store(x)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			keepMax(&peakRSS, rssKiB(s.sidecar.Process.Pid))
			if i%10 == 0 {
				if m, err := s.metrics("go_goroutines", "go_memstats_stack_inuse_bytes", "go_memstats_heap_inuse_bytes", "toolsidecar_core_requests_queued"); err == nil {
					keepMax(&peakG, int64(m["go_goroutines"]))
					keepMax(&peakStack, int64(m["go_memstats_stack_inuse_bytes"]))
					keepMax(&peakHeap, int64(m["go_memstats_heap_inuse_bytes"]))
					keepMax(&peakQueue, int64(m["toolsidecar_core_requests_queued"]))
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	return func() peaks {
		close(stop)
		wg.Wait()
		return peaks{rssMiB: float64(peakRSS.Load()) / 1024, stackMiB: float64(peakStack.Load()) / (1 << 20), heapMiB: float64(peakHeap.Load()) / (1 << 20),
			goroutines: int(peakG.Load()), coreQueue: int(peakQueue.Load())}
	}
}

// rssKiB is a process's resident set, from /proc (Linux).
func rssKiB(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

// saveHeap writes the sidecar's heap profile to path, and its goroutines,
// grouped by stack, to path.goroutines.
func (s *stack) saveHeap(path string) error {
	return s.saveProfiles(map[string]string{"heap": path, "goroutine?debug=1": path + ".goroutines"})
}

// saveProfiles writes each of the sidecar's pprof profiles to its file.
func (s *stack) saveProfiles(files map[string]string) error {
	for profile, file := range files {
		resp, err := http.Get(s.ops + "/debug/pprof/" + profile)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			return fmt.Errorf("%s: status %d %v", profile, resp.StatusCode, err)
		}
		if err := os.WriteFile(file, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// metrics sums the samples of each named metric on the sidecar's
// /metrics, from one scrape: each scrape is work for the sidecar under
// measurement (a gather of every metric, compressed), so it reads them
// all at once.
func (s *stack) metrics(names ...string) (map[string]float64, error) {
	resp, err := http.Get(s.ops + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	sums := make(map[string]float64, len(names))
	for line := range strings.SplitSeq(string(b), "\n") {
		for _, name := range names {
			if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
				fields := strings.Fields(line)
				v, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
				sums[name] += v
			}
		}
	}
	return sums, nil
}
