// Package charttest renders the Helm chart offline in every mode and
// decodes each document strictly into the Kubernetes API types: an unknown
// or misspelt field fails. It lives in its own module so that the daemon's
// go.mod stays small.
package charttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/projectdavid/toolsidecar/deploy/image"
)

const (
	chart       = "../helm/toolsidecar"
	appChart    = "../helm/examples/assistant-app"
	kubeVersion = "1.31.0"
)

// helm runs the project-local helm binary (make helm installs it).
func helm(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(helmPath(), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// render renders the toolsidecar chart alone.
func render(t *testing.T, valuesFile string, set ...string) string {
	return renderChart(t, chart, valuesFile, set...)
}

// renderApp renders the example application chart, which adds the sidecar
// to its own Deployment through the toolsidecar chart's named templates.
func renderApp(t *testing.T, set ...string) string {
	depOnce.Do(func() { helm(t, "dependency", "update", appChart, "--skip-refresh") })
	return renderChart(t, appChart, "", set...)
}

var depOnce sync.Once

func renderChart(t *testing.T, path, valuesFile string, set ...string) string {
	return helm(t, templateArgs(path, valuesFile, set)...)
}

// templateArgs is helm template of path with a values file (optional) and
// --set values; a JSON list or object value goes by --set-json.
func templateArgs(path, valuesFile string, set []string) []string {
	args := []string{"template", "rel", path, "--namespace", "ai", "--kube-version", kubeVersion}
	if valuesFile != "" {
		args = append(args, "-f", valuesFile)
	}
	for _, s := range set {
		flag := "--set"
		if strings.Contains(s, "=[") || strings.Contains(s, "={") {
			flag = "--set-json"
		}
		args = append(args, flag, s)
	}
	return args
}

// renderFails renders the toolsidecar chart and returns helm's error output.
func renderFails(t *testing.T, set ...string) string {
	t.Helper()
	out, err := exec.Command(helmPath(), templateArgs(chart, "", set)...).CombinedOutput()
	if err == nil {
		t.Errorf("%v rendered:\n%.300s", set, out)
	}
	return string(out)
}

// objects decodes every document strictly into its typed API object.
type objects struct {
	deployments []*appsv1.Deployment
	configMaps  []*corev1.ConfigMap
	services    []*corev1.Service
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
	policies    []*networkingv1.NetworkPolicy
	svcMonitors []*monitoringv1.ServiceMonitor
	podMonitors []*monitoringv1.PodMonitor
	rules       []*monitoringv1.PrometheusRule
	accounts    []*corev1.ServiceAccount
	pdbs        []*policyv1.PodDisruptionBudget
}

func decode(t *testing.T, manifest string) objects {
	t.Helper()
	var o objects
	for _, doc := range strings.Split(manifest, "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")) == "" {
			continue
		}
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		var target any
		switch meta.Kind {
		case "Deployment":
			target = add(&o.deployments)
		case "ConfigMap":
			target = add(&o.configMaps)
		case "Service":
			target = add(&o.services)
		case "HorizontalPodAutoscaler":
			target = add(&o.hpas)
		case "NetworkPolicy":
			target = add(&o.policies)
		case "ServiceMonitor":
			target = add(&o.svcMonitors)
		case "PodMonitor":
			target = add(&o.podMonitors)
		case "PrometheusRule":
			target = add(&o.rules)
		case "ServiceAccount":
			target = add(&o.accounts)
		case "PodDisruptionBudget":
			target = add(&o.pdbs)
		default:
			t.Fatalf("unexpected kind %q: add it to the strict decoder", meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
			t.Fatalf("strict decode of %s: %v\n%s", meta.Kind, err, doc)
		}
	}
	return o
}

// add appends a new zero object to list and returns it to decode into.
func add[T any](list *[]*T) *T {
	v := new(T)
	*list = append(*list, v)
	return v
}

func TestLint(t *testing.T) {
	for _, f := range append([]string{""}, examples(t)...) {
		args := []string{"lint", chart, "--strict", "--kube-version", kubeVersion}
		if f != "" {
			args = append(args, "-f", f)
		}
		out := helm(t, args...)
		if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("lint %s:\n%s", f, out)
		}
	}
}

func examples(t *testing.T) []string {
	files, err := filepath.Glob("../helm/examples/*.yaml")
	if err != nil || len(files) != 4 {
		t.Fatalf("example values: %v %v", files, err)
	}
	return files
}

// app returns the example application's Deployment and its sidecar
// container, wherever the mode put it.
func app(t *testing.T, o objects) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	for _, d := range o.deployments {
		if d.Name != "rel-assistant-app" {
			continue
		}
		pod := d.Spec.Template.Spec
		for _, c := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
			if c.Name == "toolsidecar" {
				return d, c
			}
		}
		t.Fatalf("the application's pod has no toolsidecar container: %+v", pod)
	}
	t.Fatalf("no application Deployment among %d", len(o.deployments))
	return nil, corev1.Container{}
}

func configOf(t *testing.T, o objects, name string) string {
	t.Helper()
	for _, cm := range o.configMaps {
		if cm.Name == name {
			return cm.Data["config.yaml"]
		}
	}
	t.Fatalf("no ConfigMap %s", name)
	return ""
}

func volume(pod corev1.PodSpec, name string) *corev1.Volume {
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == name {
			return &pod.Volumes[i]
		}
	}
	return nil
}

func mount(c corev1.Container, name string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func hasAll(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

// TestDefaultInstall: installed alone, the chart deploys no placeholder
// application: only the sidecar's configuration, with the API on loopback,
// probes and metrics on the ops port, and readiness that does not hang on
// Core.
func TestDefaultInstall(t *testing.T) {
	o := decode(t, render(t, ""))
	if len(o.deployments) != 0 || len(o.services) != 0 || len(o.accounts) != 0 || len(o.configMaps) != 1 {
		t.Fatalf("default install: %d deployments, %d services, %d service accounts, %d configmaps; want only the config",
			len(o.deployments), len(o.services), len(o.accounts), len(o.configMaps))
	}
	cfg := configOf(t, o, "rel-toolsidecar-config")
	hasAll(t, "config.yaml", cfg, `listen: "127.0.0.1:8741"`, `ops_listen: "0.0.0.0:8742"`, "readiness_check: false",
		`url: ""`, "name: get_flight_times", "max_parallel: 16", "max_drives: 512", "max_connections: 64", "http2_cleartext: false", "ui: true")
	if strings.Contains(cfg, "api_key_file") {
		t.Error("no Secret configured, yet an api_key_file is set")
	}
	h2c := configOf(t, decode(t, render(t, "", "sidecar.http2Cleartext=true")), "rel-toolsidecar-config")
	hasAll(t, "config.yaml with sidecar.http2Cleartext", h2c, "http2_cleartext: true")
	noUI := configOf(t, decode(t, render(t, "", "sidecar.ui=false")), "rel-toolsidecar-config")
	hasAll(t, "config.yaml with sidecar.ui=false", noUI, "ui: false")
}

// TestExampleAppNative: the example application chart gets the sidecar as a
// native sidecar (an init container that restarts always), with every
// probe on the ops port, a memory limit above the measured peak and no
// GOMEMLIMIT (the binary sets its own below the container's limit), and
// the volumes its mounts need.
func TestExampleAppNative(t *testing.T) {
	o := decode(t, renderApp(t))
	d, c := app(t, o)
	pod := d.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].Name != "toolsidecar" || c.RestartPolicy == nil ||
		*c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("native mode: init containers %v, restart policy %v", pod.InitContainers, c.RestartPolicy)
	}
	if len(pod.Containers) != 2 || pod.Containers[0].Name != "app" || pod.Containers[1].Name != "worker" {
		t.Errorf("containers %v: want the application's and its worker", pod.Containers)
	}
	// The worker container connects with the credentials the sidecar
	// writes: the file the variable names is on the volume the sidecar
	// writes to (read-write) and the worker reads (read-only), in memory;
	// the sidecar's config names that file.
	w := pod.Containers[1]
	var creds string
	for _, e := range w.Env {
		if e.Name == "TOOLSIDECAR_WORKER_CREDENTIALS" {
			creds = e.Value
		}
	}
	wm, sm, wv := mount(w, "toolsidecar-workers"), mount(c, "toolsidecar-workers"), volume(pod, "toolsidecar-workers")
	if wm == nil || !wm.ReadOnly || sm == nil || sm.ReadOnly || wm.MountPath != sm.MountPath || creds != wm.MountPath+"/worker-credentials.json" ||
		wv == nil || wv.EmptyDir == nil || wv.EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("worker credentials: env %q, worker mount %+v, sidecar mount %+v, volume %+v", creds, wm, sm, wv)
	}
	hasAll(t, "config.yaml", configOf(t, o, "rel-toolsidecar-config"), "worker_credentials: true", `worker_credentials_file: "`+creds+`"`)
	if got := strings.Join(c.Args, " "); got != "run --config /etc/toolsidecar/config.yaml --log-level info" {
		t.Errorf("args %q", got)
	}
	// The tag defaults to the one make image builds (package image), on
	// the repository the operator pushed it to.
	built, err := image.Defaults(image.Spec{Root: "../.."})
	if err != nil {
		t.Fatal(err)
	}
	if _, tag, _ := strings.Cut(built.Ref(), ":"); c.Image != "registry.example.com/toolsidecar:"+tag {
		t.Errorf("image %q (tag defaults to appVersion), want make image's tag, %q", c.Image, built.Ref())
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "ops" || c.Ports[0].ContainerPort != 8742 {
		t.Errorf("ports %+v: only the ops port leaves the pod", c.Ports)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}[name]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.String() != "ops" {
			t.Errorf("%s probe %+v: want %s on port ops", name, p, want)
		}
	}
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			t.Errorf("env %+v: GOMEMLIMIT would override the limit the binary sets below the container's", e)
		}
	}
	// BENCHMARKS.md: 178–186 MiB at 1,000 runs in flight, about twice
	// the default max_drives; the runtime's limit is a tenth below the
	// container's.
	peak := resource.MustParse("190Mi")
	if lim := c.Resources.Limits.Memory(); lim.Value()-lim.Value()/10 <= peak.Value() {
		t.Errorf("memory limit %v: the runtime's limit, a tenth below it, must be above the measured peak %v", lim, peak)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || fmt.Sprint(sc.Capabilities.Drop) != "[ALL]" {
		t.Errorf("container securityContext %+v", sc)
	}
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds != 45 {
		t.Errorf("grace period %v, want shutdownTimeout + 15", pod.TerminationGracePeriodSeconds)
	}
	// Every mount has its volume; the config volume names the ConfigMap
	// the release renders.
	for _, m := range c.VolumeMounts {
		if volume(pod, m.Name) == nil {
			t.Errorf("mount %s has no volume", m.Name)
		}
	}
	cv := volume(pod, "toolsidecar-config")
	if cv == nil || cv.ConfigMap == nil {
		t.Fatalf("no config volume: %+v", pod.Volumes)
	}
	configOf(t, o, cv.ConfigMap.Name)
	if k := volume(pod, "core-api-key"); k == nil || k.Secret == nil || k.Secret.SecretName != "projectdavid-core" ||
		mount(c, "core-api-key") == nil || !mount(c, "core-api-key").ReadOnly {
		t.Errorf("Core API key not mounted read-only from its Secret: %+v", k)
	}
	var sdk string
	for _, e := range pod.Containers[0].Env {
		if e.Name == "ENTITIES_BASE_URL" {
			sdk = e.Value
		}
	}
	if sdk != "http://127.0.0.1:8741" {
		t.Errorf("the SDK points at %q, want the sidecar on loopback", sdk)
	}
}

// TestExampleAppClassic: sidecar.mode classic puts the sidecar among the
// ordinary containers, for clusters before native sidecars.
func TestExampleAppClassic(t *testing.T) {
	d, c := app(t, decode(t, renderApp(t, "toolsidecar.sidecar.mode=classic")))
	pod := d.Spec.Template.Spec
	if len(pod.InitContainers) != 0 || len(pod.Containers) != 3 || pod.Containers[2].Name != "toolsidecar" || c.RestartPolicy != nil {
		t.Errorf("classic mode: init containers %v, containers %v, restart policy %v", pod.InitContainers, pod.Containers, c.RestartPolicy)
	}
}

// TestChecksumRollsPods: changing the sidecar's configuration changes the
// application's pod template.
func TestChecksumRollsPods(t *testing.T) {
	sum := func(set ...string) string {
		d, _ := app(t, decode(t, renderApp(t, set...)))
		return d.Spec.Template.Annotations["checksum/toolsidecar-config"]
	}
	a, b := sum(), sum("toolsidecar.executor.maxParallel=8")
	if len(a) != 64 || a == b {
		t.Fatalf("checksum %q then %q: a config change must change it", a, b)
	}
	if a != sum() {
		t.Error("checksum is not stable")
	}
}

// TestMonitoringOnOpsPort: the ServiceMonitor scrapes the ops port of the
// application's own pods (through a headless Service that selects them by
// podSelector), and the NetworkPolicy selects those pods, opens the ops port
// to the monitoring namespace only and keeps the application's own port
// open.
func TestMonitoringOnOpsPort(t *testing.T) {
	o := decode(t, renderApp(t))
	d, _ := app(t, o)
	podLabels := d.Spec.Template.Labels
	selects := func(sel map[string]string) bool {
		for k, v := range sel {
			if podLabels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	var ops *corev1.Service
	for _, s := range o.services {
		if s.Name == "rel-toolsidecar-ops" {
			ops = s
		}
	}
	if ops == nil || ops.Spec.ClusterIP != "None" || !selects(ops.Spec.Selector) || len(ops.Spec.Ports) != 1 || ops.Spec.Ports[0].TargetPort.String() != "ops" {
		t.Fatalf("ops Service %+v: want headless, selecting the application's pods, on port ops", ops)
	}
	if len(o.svcMonitors) != 1 {
		t.Fatalf("%d ServiceMonitors", len(o.svcMonitors))
	}
	sm := o.svcMonitors[0]
	for k, v := range sm.Spec.Selector.MatchLabels {
		if ops.Labels[k] != v {
			t.Errorf("the ServiceMonitor's selector %v misses the ops Service's labels %v", sm.Spec.Selector.MatchLabels, ops.Labels)
		}
	}
	if ep := sm.Spec.Endpoints; len(ep) != 1 || ep[0].Port != "ops" || ep[0].Path != "/metrics" || sm.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor %+v", sm.Spec)
	}
	if len(o.policies) != 1 {
		t.Fatalf("%d NetworkPolicies", len(o.policies))
	}
	np := o.policies[0].Spec
	if !selects(np.PodSelector.MatchLabels) || len(np.Ingress) != 2 {
		t.Fatalf("NetworkPolicy %+v: want the application's pods, 2 rules", np)
	}
	metrics, own := np.Ingress[0], np.Ingress[1]
	if metrics.Ports[0].Port.String() != "ops" || metrics.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
		t.Errorf("metrics rule %+v", metrics)
	}
	if own.Ports[0].Port.IntValue() != 8080 || len(own.From) != 0 {
		t.Errorf("the application's own rule %+v: its port 8080, from anywhere", own)
	}
}

// TestSelectorsRequired: what selects the application's pods refuses to
// render without podSelector, and a NetworkPolicy without the application's
// own ingress rules, rather than cut its traffic off; an explicit empty
// list is accepted.
func TestSelectorsRequired(t *testing.T) {
	for _, what := range []string{"serviceMonitor", "podMonitor", "networkPolicy"} {
		set := []string{what + ".enabled=true"}
		if what == "networkPolicy" {
			set = append(set, "networkPolicy.applicationIngress=[]")
		}
		if out := renderFails(t, set...); !strings.Contains(out, what+" selects your application's pods: set podSelector") {
			t.Errorf("%s without podSelector: %s", what, out)
		}
	}
	if out := renderFails(t, "networkPolicy.enabled=true", "podSelector.app=x"); !strings.Contains(out, "networkPolicy.applicationIngress") {
		t.Errorf("NetworkPolicy without the application's rules: %s", out)
	}
	o := decode(t, render(t, "", "networkPolicy.enabled=true", "podSelector.app=x", "networkPolicy.applicationIngress=[]"))
	if len(o.policies) != 1 || len(o.policies[0].Spec.Ingress) != 1 {
		t.Errorf("applicationIngress [] must leave the ops rule alone: %+v", o.policies)
	}
}

// TestEmbeddedStore: with the embedded server in durable mode (the
// default), JetStream's files go to a volume mounted at store_dir, since
// the root filesystem is read-only; with an external NATS or durability
// off there is none, and the cluster example keeps 3 replicas.
func TestEmbeddedStore(t *testing.T) {
	o := decode(t, renderApp(t))
	d, c := app(t, o)
	hasAll(t, "config.yaml", configOf(t, o, "rel-toolsidecar-config"), `store_dir: "/var/lib/toolsidecar/jetstream"`, "enabled: true")
	m, v := mount(c, "toolsidecar-store"), volume(d.Spec.Template.Spec, "toolsidecar-store")
	if m == nil || m.MountPath != "/var/lib/toolsidecar/jetstream" || m.ReadOnly || v == nil || v.EmptyDir == nil || v.EmptyDir.SizeLimit.String() != "1Gi" {
		t.Errorf("store: mount %+v, volume %+v", m, v)
	}
	for _, set := range []string{"toolsidecar.nats.url=nats://nats:4222", "toolsidecar.durability.enabled=false"} {
		o := decode(t, renderApp(t, set))
		d, _ := app(t, o)
		if volume(d.Spec.Template.Spec, "toolsidecar-store") != nil || strings.Contains(configOf(t, o, "rel-toolsidecar-config"), "store_dir") {
			t.Errorf("%s: a store volume or store_dir remains", set)
		}
	}
	// On an external NATS the workers bring their own credentials: no
	// shared volume, no variable.
	d, _ = app(t, decode(t, renderApp(t, "toolsidecar.nats.url=nats://nats:4222")))
	if pod := d.Spec.Template.Spec; volume(pod, "toolsidecar-workers") != nil || len(pod.Containers[1].Env) != 0 || len(pod.Containers[1].VolumeMounts) != 0 {
		t.Errorf("external NATS: the worker credentials are still shared: %+v", pod.Containers[1])
	}
	ext := decode(t, render(t, "../helm/examples/external-nats.yaml"))
	if cfg := configOf(t, ext, "rel-toolsidecar-config"); !strings.Contains(cfg, "replicas: 3") || strings.Contains(cfg, "store_dir") {
		t.Errorf("external cluster config:\n%s", cfg)
	}
}

// TestExternalNATSTLSAndCredentials: an external NATS over TLS with a
// credentials file: both come from Secrets, mounted read-only where the
// rendered config.yaml looks for them, in the sidecar and in the workers.
func TestExternalNATSTLSAndCredentials(t *testing.T) {
	set := []string{"toolsidecar.nats.url=tls://nats.nats.svc:4222", "toolsidecar.nats.credsSecret.name=toolsidecar-nats",
		"toolsidecar.nats.tls.secretName=nats-tls", "toolsidecar.nats.tls.certKey=tls.crt", "toolsidecar.nats.tls.keyKey=tls.key",
		"toolsidecar.workers.enabled=true", "toolsidecar.workers.tools[0].name=shout", "toolsidecar.workers.tools[0].route=http",
		"toolsidecar.workers.tools[0].http.url=http://shout:8080"}
	o := decode(t, renderApp(t, set...))
	d, c := app(t, o)
	var w *appsv1.Deployment
	for _, x := range o.deployments {
		if x.Name == "rel-toolsidecar-worker" {
			w = x
		}
	}
	if w == nil {
		t.Fatal("no worker Deployment")
	}
	for _, p := range []struct {
		name   string
		pod    corev1.PodSpec
		c      corev1.Container
		config string
	}{
		{"sidecar", d.Spec.Template.Spec, c, configOf(t, o, "rel-toolsidecar-config")},
		{"worker", w.Spec.Template.Spec, w.Spec.Template.Spec.Containers[0], configOf(t, o, "rel-toolsidecar-worker-config")},
	} {
		hasAll(t, p.name+" config.yaml", p.config, `url: "tls://nats.nats.svc:4222"`, "creds_file: /var/run/secrets/toolsidecar/nats/nats.creds",
			"ca_file: /var/run/secrets/toolsidecar/nats-tls/ca.crt", "cert_file: /var/run/secrets/toolsidecar/nats-tls/tls.crt",
			"key_file: /var/run/secrets/toolsidecar/nats-tls/tls.key")
		for vol, secret := range map[string]string{"nats-creds": "toolsidecar-nats", "nats-tls": "nats-tls"} {
			v, m := volume(p.pod, vol), mount(p.c, vol)
			if v == nil || v.Secret == nil || v.Secret.SecretName != secret || m == nil || !m.ReadOnly {
				t.Errorf("%s: %s volume %+v, mount %+v; want Secret %s mounted read-only", p.name, vol, v, m, secret)
			}
		}
	}
}

// coreTLS sets Core's CA and client certificate from a Secret.
var coreTLS = []string{"core.tls.secretName=core-tls-files", "core.tls.certKey=tls.crt", "core.tls.keyKey=tls.key", "core.maxConnections=128"}

// TestCoreTLS: Core's CA bundle and client certificate come from a
// Secret, mounted read-only in the sidecar (and only there: workers do not
// talk to Core) where its config.yaml looks for them; without the Secret
// neither the section nor the volume is rendered.
func TestCoreTLS(t *testing.T) {
	set := []string{"toolsidecar.nats.url=nats://nats:4222", "toolsidecar.workers.enabled=true", "toolsidecar.workers.tools[0].name=shout",
		"toolsidecar.workers.tools[0].route=http", "toolsidecar.workers.tools[0].http.url=http://shout:8080"}
	for _, v := range coreTLS {
		set = append(set, "toolsidecar."+v)
	}
	o := decode(t, renderApp(t, set...))
	d, c := app(t, o)
	hasAll(t, "config.yaml", configOf(t, o, "rel-toolsidecar-config"), "max_connections: 128",
		"ca_file: /var/run/secrets/toolsidecar/core-tls/ca.crt", "cert_file: /var/run/secrets/toolsidecar/core-tls/tls.crt",
		"key_file: /var/run/secrets/toolsidecar/core-tls/tls.key")
	if v, m := volume(d.Spec.Template.Spec, "core-tls"), mount(c, "core-tls"); v == nil || v.Secret == nil || v.Secret.SecretName != "core-tls-files" ||
		m == nil || !m.ReadOnly || m.MountPath != "/var/run/secrets/toolsidecar/core-tls" {
		t.Errorf("core-tls volume %+v, mount %+v; want Secret core-tls-files mounted read-only", v, m)
	}
	var workers int
	for _, w := range o.deployments {
		if w.Name == "rel-toolsidecar-worker" {
			workers++
			if volume(w.Spec.Template.Spec, "core-tls") != nil {
				t.Error("the workers get Core's TLS files")
			}
		}
	}
	if workers != 1 || strings.Contains(configOf(t, o, "rel-toolsidecar-worker-config"), "core-tls") {
		t.Errorf("%d worker Deployments, or Core's TLS files in the workers' config", workers)
	}
	def := decode(t, renderApp(t))
	dd, dc := app(t, def)
	if cfg := configOf(t, def, "rel-toolsidecar-config"); strings.Contains(cfg, "core-tls") || !strings.Contains(cfg, "max_connections: 64") {
		t.Errorf("default config.yaml:\n%s", cfg)
	}
	if volume(dd.Spec.Template.Spec, "core-tls") != nil || mount(dc, "core-tls") != nil {
		t.Error("a core-tls volume without core.tls.secretName")
	}
}

// TestWorkersWithHPA: the worker Deployment has its probes and metrics on
// the ops port, a PDB, and an HPA that scales on calls in flight per pod
// rather than CPU; its pods carry no API token.
func TestWorkersWithHPA(t *testing.T) {
	o := decode(t, render(t, "../helm/examples/workers-hpa.yaml"))
	if len(o.deployments) != 1 || len(o.hpas) != 1 || len(o.pdbs) != 1 || len(o.podMonitors) != 2 || len(o.accounts) != 1 {
		t.Fatalf("%d deployments, %d hpas, %d pdbs, %d pod monitors, %d service accounts", len(o.deployments), len(o.hpas), len(o.pdbs),
			len(o.podMonitors), len(o.accounts))
	}
	w := o.deployments[0]
	p := w.Spec.Template.Spec
	if w.Spec.Replicas != nil {
		t.Error("worker replicas must be left to the HPA")
	}
	if p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken || p.ServiceAccountName != o.accounts[0].Name ||
		o.accounts[0].AutomountServiceAccountToken == nil || *o.accounts[0].AutomountServiceAccountToken {
		t.Errorf("service account %q, automount %v", p.ServiceAccountName, p.AutomountServiceAccountToken)
	}
	c := p.Containers[0]
	if strings.Join(c.Args[:3], " ") != "worker --config /etc/toolsidecar/config.yaml" || c.SecurityContext == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("worker container %+v", c)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Port.String() != "ops" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		len(c.Ports) != 1 || c.Ports[0].Name != "ops" {
		t.Errorf("worker probes %+v %+v, ports %+v", c.LivenessProbe, c.ReadinessProbe, c.Ports)
	}
	hasAll(t, "worker config.yaml", configOf(t, o, "rel-toolsidecar-worker-config"), `ops_listen: "0.0.0.0:8742"`)
	h := o.hpas[0].Spec
	if h.ScaleTargetRef.Name != w.Name || h.MaxReplicas != 8 || *h.MinReplicas != 2 || len(h.Metrics) != 1 {
		t.Fatalf("hpa %+v", h)
	}
	m := h.Metrics[0]
	if m.Type != autoscalingv2.PodsMetricSourceType || m.Pods.Metric.Name != "toolsidecar_worker_calls_in_flight" ||
		m.Pods.Target.AverageValue == nil || m.Pods.Target.AverageValue.String() != "32" {
		t.Errorf("hpa metric %+v: want calls in flight per pod", m)
	}
	var workerMonitor bool
	for _, pm := range o.podMonitors {
		if pm.Spec.Selector.MatchLabels["app.kubernetes.io/component"] == "worker" && pm.Spec.PodMetricsEndpoints[0].Port != nil &&
			*pm.Spec.PodMetricsEndpoints[0].Port == "ops" {
			workerMonitor = true
		}
	}
	if !workerMonitor {
		t.Error("no PodMonitor on the workers' ops port")
	}
	if pdb := o.pdbs[0]; pdb.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "worker" {
		t.Errorf("PDB %+v", pdb.Spec)
	}
}

// TestWorkerChecksumFollowsNATS: a change of the workers' NATS settings,
// not only of their tools, rolls them.
func TestWorkerChecksumFollowsNATS(t *testing.T) {
	sum := func(set ...string) string {
		o := decode(t, render(t, "../helm/examples/workers-hpa.yaml", set...))
		return o.deployments[0].Spec.Template.Annotations["checksum/config"]
	}
	base := sum()
	for _, set := range []string{"nats.url=nats://other:4222", "nats.credsSecret.name=creds", "nats.tls.secretName=tls"} {
		if got := sum(set); got == base {
			t.Errorf("%s left the workers' checksum unchanged", set)
		}
	}
}

// TestSchemaRejects: values.schema.json catches bad values before render.
func TestSchemaRejects(t *testing.T) {
	for _, set := range []string{"executor.missingTool=ignore", "sidecar.port=0", "sidecar.opsPort=70000", "sidecar.mode=sideways",
		"tools[0].name=bad.name", "unknownKey=1", "core.url=ftp://x", "workers.hpa.targetAverageValue=lots", "core.maxConnections=0",
		"core.tls.caKey=", "core.tls.other=x", "sidecar.maxDrives=0", "sidecar.http2Cleartext=sometimes", "sidecar.ui=maybe",
		"upstream.kind=gpt", "sidecar.uiHistory=-1", "executor.runBudget.onBudget=halt", "image.digest=latest", "nats.embedded.sync=never"} {
		renderFails(t, set)
	}
	if out := renderFails(t, "workers.enabled=true"); !strings.Contains(out, "workers.enabled needs nats.url") {
		t.Errorf("workers without NATS: %s", out)
	}
}

func helmPath() string {
	if bin := os.Getenv("HELM"); bin != "" {
		return bin
	}
	bin, _ := filepath.Abs("../../bin/helm")
	return bin
}

// TestRenderedConfigLoads: every config.yaml the charts render (sidecar and
// workers, every example) passes the daemon's own strict loader.
func TestRenderedConfigLoads(t *testing.T) {
	var renders []string
	for _, f := range append([]string{""}, examples(t)...) {
		renders = append(renders, render(t, f))
	}
	renders = append(renders, renderApp(t), render(t, "", coreTLS...))
	seen := 0
	for _, r := range renders {
		for _, cm := range decode(t, r).configMaps {
			body, ok := cm.Data["config.yaml"]
			if !ok {
				continue
			}
			seen++
			path := filepath.Join(t.TempDir(), "config.yaml")
			os.WriteFile(path, []byte(body), 0o600)
			cmd := exec.Command("go", "run", "./cmd/toolsidecar", "check", "--references=false", "--config", path) // its files live in the pod
			cmd.Dir = "../.."
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: the daemon rejects the rendered config: %v\n%s\n%s", cm.Name, err, out, body)
			}
		}
	}
	if seen < 6 {
		t.Errorf("only %d rendered configs checked", seen)
	}
}

// TestAlertsAndDashboard: with both enabled, the chart renders the alert
// rules as a PrometheusRule (decoded strictly) and the dashboard as a
// ConfigMap Grafana's sidecar picks up, from the files a test in the main
// module checks against /metrics.
func TestAlertsAndDashboard(t *testing.T) {
	o := decode(t, render(t, "", "prometheusRule.enabled=true", "grafanaDashboard.enabled=true"))
	if len(o.rules) != 1 || len(o.rules[0].Spec.Groups) != 1 || len(o.rules[0].Spec.Groups[0].Rules) < 5 {
		t.Fatalf("PrometheusRule %+v", o.rules)
	}
	for _, r := range o.rules[0].Spec.Groups[0].Rules {
		if r.Alert == "" || r.Expr.String() == "" || r.Labels["severity"] == "" {
			t.Errorf("rule %+v lacks a name, an expression or a severity", r)
		}
	}
	var dash *corev1.ConfigMap
	for _, cm := range o.configMaps {
		if cm.Labels["grafana_dashboard"] == "1" {
			dash = cm
		}
	}
	var d struct {
		Title  string `json:"title"`
		Panels []any  `json:"panels"`
	}
	if dash == nil || json.Unmarshal([]byte(dash.Data["toolsidecar.json"]), &d) != nil || d.Title != "toolsidecar" || len(d.Panels) < 10 {
		t.Errorf("dashboard ConfigMap %v", dash)
	}
	if off := decode(t, render(t, "")); len(off.rules) != 0 {
		t.Error("a PrometheusRule by default")
	}
}

// TestExtras: extra env, volumes and mounts reach the sidecar, and a name
// override renames the ConfigMap and the volume that points at it alike.
func TestExtras(t *testing.T) {
	base, _ := app(t, decode(t, renderApp(t)))
	_, bc := app(t, decode(t, renderApp(t)))
	o := decode(t, renderApp(t, "toolsidecar.nameOverride=tools", "toolsidecar.sidecar.extraEnv[0].name=OTEL_SERVICE_NAME",
		"toolsidecar.sidecar.extraEnv[0].value=assistant", "toolsidecar.extraVolumes[0].name=scratch", "toolsidecar.extraVolumes[0].emptyDir.medium=Memory",
		"toolsidecar.sidecar.extraVolumeMounts[0].name=scratch", "toolsidecar.sidecar.extraVolumeMounts[0].mountPath=/scratch"))
	d, c := app(t, o)
	if len(c.Env) != len(bc.Env)+1 || c.Env[len(c.Env)-1].Name != "OTEL_SERVICE_NAME" {
		t.Errorf("extra env %v", c.Env)
	}
	if m := mount(c, "scratch"); m == nil || m.MountPath != "/scratch" {
		t.Errorf("extra mount %v", c.VolumeMounts)
	}
	pod := d.Spec.Template.Spec
	if v := volume(pod, "scratch"); v == nil || v.EmptyDir == nil || len(pod.Volumes) != len(base.Spec.Template.Spec.Volumes)+1 {
		t.Errorf("extra volume: %+v", pod.Volumes)
	}
	cv := volume(pod, "toolsidecar-config")
	if cv == nil || cv.ConfigMap.Name != "rel-tools-config" {
		t.Fatalf("config volume %+v after nameOverride", cv)
	}
	configOf(t, o, "rel-tools-config")
}

// TestNativeNeedsKubernetes129: on a cluster before 1.29 the default
// native sidecar is refused, saying what to set; classic renders.
func TestNativeNeedsKubernetes129(t *testing.T) {
	renderOn := func(version string, set ...string) (string, error) {
		depOnce.Do(func() { helm(t, "dependency", "update", appChart, "--skip-refresh") })
		args := templateArgs(appChart, "", set)
		for i, a := range args {
			if a == "--kube-version" {
				args[i+1] = version
			}
		}
		out, err := exec.Command(helmPath(), args...).CombinedOutput()
		return string(out), err
	}
	if out, err := renderOn("1.28.0"); err == nil || !strings.Contains(out, "sidecar.mode native needs Kubernetes 1.29+") {
		t.Errorf("native on 1.28 rendered (err %v):\n%.300s", err, out)
	}
	if out, err := renderOn("1.28.0", "toolsidecar.sidecar.mode=classic"); err != nil {
		t.Errorf("classic on 1.28: %v\n%.300s", err, out)
	}
	if out, err := renderOn("1.29.0"); err != nil {
		t.Errorf("native on 1.29: %v\n%.300s", err, out)
	}
}

// TestDefaultToolsAgreeWithExampleWorker: every tool of the chart's
// default tools that examples/go-worker declares gives no schema or
// description of its own, so the worker's declaration fills them in and
// cannot conflict (a conflict leaves the declaration out).
func TestDefaultToolsAgreeWithExampleWorker(t *testing.T) {
	src, err := os.ReadFile("../../examples/go-worker/main.go")
	if err != nil {
		t.Fatal(err)
	}
	declared := regexp.MustCompile(`worker\.Declare\(w, "([^"]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(declared) == 0 {
		t.Fatal("examples/go-worker declares no tool")
	}
	var cfg struct {
		Tools []map[string]any `json:"tools"`
	}
	if err := yaml.Unmarshal([]byte(configOf(t, decode(t, render(t, "")), "rel-toolsidecar-config")), &cfg); err != nil {
		t.Fatal(err)
	}
	for _, d := range declared {
		for _, tl := range cfg.Tools {
			if tl["name"] != d[1] {
				continue
			}
			if _, ok := tl["parameters"]; ok {
				t.Errorf("the default entry of %s gives a schema of its own: %v", d[1], tl["parameters"])
			}
			if _, ok := tl["description"]; ok {
				t.Errorf("the default entry of %s gives a description of its own", d[1])
			}
		}
	}
}
