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
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const (
	chart       = "../helm/toolsidecar"
	kubeVersion = "1.31.0"
)

// helm runs the project-local helm binary (make helm installs it).
func helm(t *testing.T, args ...string) string {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin/helm")
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

func render(t *testing.T, valuesFile string, set ...string) string {
	args := []string{"template", "rel", chart, "--namespace", "ai", "--kube-version", kubeVersion}
	if valuesFile != "" {
		args = append(args, "-f", valuesFile)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return helm(t, args...)
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
	if err != nil || len(files) != 3 {
		t.Fatalf("example values: %v %v", files, err)
	}
	return files
}

func sidecar(t *testing.T, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "toolsidecar" {
			return c
		}
	}
	t.Fatalf("deployment %s has no toolsidecar container", d.Name)
	return corev1.Container{}
}

// TestDefaultValues asserts the fields that matter on the default render.
func TestDefaultValues(t *testing.T) {
	o := decode(t, render(t, ""))
	if len(o.deployments) != 1 || len(o.configMaps) != 1 || len(o.services) != 1 {
		t.Fatalf("objects: %d deployments, %d configmaps, %d services", len(o.deployments), len(o.configMaps), len(o.services))
	}
	d := o.deployments[0]
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 2 || pod.Containers[0].Name != "assistant-app" {
		t.Fatalf("the example pod must hold the app and the sidecar: %v", pod.Containers)
	}
	c := sidecar(t, d)
	if got := strings.Join(c.Args, " "); got != "run --config /etc/toolsidecar/config.yaml --log-level info" {
		t.Errorf("args %q", got)
	}
	if c.Image != "ghcr.io/projectdavid/toolsidecar:0.1.0" {
		t.Errorf("image %q (tag defaults to appVersion)", c.Image)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		c.ReadinessProbe.HTTPGet.Port.String() != "http" {
		t.Errorf("probes %+v %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || fmt.Sprint(sc.Capabilities.Drop) != "[ALL]" {
		t.Errorf("container securityContext %+v", sc)
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", psc)
	}
	if c.Resources.Requests.Memory().String() != "48Mi" || c.Resources.Limits.Memory().String() != "256Mi" {
		t.Errorf("resources %+v", c.Resources)
	}
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds != 45 {
		t.Errorf("grace period %v, want shutdownTimeout + 15", pod.TerminationGracePeriodSeconds)
	}
	cfg := o.configMaps[0].Data["config.yaml"]
	for _, want := range []string{`listen: "0.0.0.0:8080"`, `url: ""`, "name: get_flight_times", "max_parallel: 16"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config.yaml lacks %q:\n%s", want, cfg)
		}
	}
	if strings.Contains(cfg, "api_key_file") {
		t.Error("no Secret configured, yet an api_key_file is set")
	}
}

// TestChecksumRollsPods: changing the configuration changes the pod template.
func TestChecksumRollsPods(t *testing.T) {
	sum := func(set ...string) string {
		o := decode(t, render(t, "", set...))
		return o.deployments[0].Spec.Template.Annotations["checksum/config"]
	}
	a, b := sum(), sum("executor.maxParallel=8")
	if len(a) != 64 || a == b {
		t.Fatalf("checksum/config %q then %q: a config change must change it", a, b)
	}
	if a != sum() {
		t.Error("checksum is not stable")
	}
}

// TestSecretReferences: the API key comes from an existing Secret as a
// file, never from values.
func TestSecretReferences(t *testing.T) {
	o := decode(t, render(t, "../helm/examples/external-nats.yaml"))
	d := o.deployments[0]
	var found bool
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "core-api-key" {
			found = v.Secret != nil && v.Secret.SecretName == "projectdavid-core" && v.Secret.Items[0].Key == "api-key"
		}
	}
	if !found {
		t.Fatalf("no core-api-key volume from Secret projectdavid-core: %+v", d.Spec.Template.Spec.Volumes)
	}
	c := sidecar(t, d)
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || (m.Name == "core-api-key" && m.ReadOnly && m.MountPath == "/var/run/secrets/toolsidecar/core")
	}
	if !mounted {
		t.Errorf("secret not mounted read-only: %+v", c.VolumeMounts)
	}
	for _, e := range c.Env {
		if strings.Contains(strings.ToLower(e.Name), "key") && e.Value != "" {
			t.Errorf("a key in clear in env: %s", e.Name)
		}
	}
	cfg := o.configMaps[0].Data["config.yaml"]
	for _, want := range []string{"api_key_file: /var/run/secrets/toolsidecar/core/api-key", `url: "nats://nats.nats.svc:4222"`,
		"creds_file: /var/run/secrets/toolsidecar/nats/nats.creds", "auth_token_file: /var/run/secrets/toolsidecar/token/token"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config.yaml lacks %q:\n%s", want, cfg)
		}
	}
	if len(o.svcMonitors) != 1 || o.svcMonitors[0].Spec.Endpoints[0].Path != "/metrics" || o.svcMonitors[0].Labels["release"] != "prometheus" {
		t.Errorf("service monitor %+v", o.svcMonitors)
	}
	if len(o.policies) != 1 || o.policies[0].Spec.Ingress[0].Ports[0].Port.String() != "http" {
		t.Errorf("network policy %+v", o.policies)
	}
}

func TestEmbeddedMode(t *testing.T) {
	o := decode(t, render(t, "../helm/examples/embedded.yaml"))
	cfg := o.configMaps[0].Data["config.yaml"]
	if !strings.Contains(cfg, `url: ""`) || !strings.Contains(cfg, `listen: "127.0.0.1:4222"`) || !strings.Contains(cfg, "route: http") {
		t.Errorf("embedded config:\n%s", cfg)
	}
}

func TestWorkersWithHPA(t *testing.T) {
	o := decode(t, render(t, "../helm/examples/workers-hpa.yaml"))
	for _, d := range o.deployments {
		if p := d.Spec.Template.Spec; p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken || p.ServiceAccountName == "" {
			t.Errorf("%s: service account %q, automount %v", d.Name, p.ServiceAccountName, p.AutomountServiceAccountToken)
		}
	}
	if len(o.deployments) != 2 || len(o.hpas) != 1 || len(o.podMonitors) != 1 {
		t.Fatalf("%d deployments, %d hpas, %d pod monitors", len(o.deployments), len(o.hpas), len(o.podMonitors))
	}
	var w *appsv1.Deployment
	for _, d := range o.deployments {
		if strings.HasSuffix(d.Name, "-worker") {
			w = d
		}
	}
	if w == nil || w.Spec.Replicas != nil {
		t.Fatalf("worker deployment %v: replicas must be left to the HPA", w)
	}
	c := w.Spec.Template.Spec.Containers[0]
	if strings.Join(c.Args[:3], " ") != "worker --config /etc/toolsidecar/config.yaml" || c.SecurityContext == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("worker container %+v", c)
	}
	h := o.hpas[0]
	if h.Spec.ScaleTargetRef.Name != w.Name || h.Spec.MaxReplicas != 8 || *h.Spec.MinReplicas != 2 {
		t.Errorf("hpa %+v", h.Spec)
	}
}

// TestSchemaRejects: values.schema.json catches bad values before render.
func TestSchemaRejects(t *testing.T) {
	for _, set := range []string{"executor.missingTool=ignore", "sidecar.port=0", "tools[0].name=bad.name", "unknownKey=1", "core.url=ftp://x"} {
		cmd := exec.Command(helmPath(), "template", "rel", chart, "--kube-version", kubeVersion, "--set", set)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("--set %s rendered:\n%.200s", set, out)
		}
	}
	cmd := exec.Command(helmPath(), "template", "rel", chart, "--kube-version", kubeVersion, "--set", "workers.enabled=true")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "workers.enabled needs nats.url") {
		t.Errorf("workers without NATS: %v %s", err, out)
	}
}

func helmPath() string {
	if bin := os.Getenv("HELM"); bin != "" {
		return bin
	}
	bin, _ := filepath.Abs("../../bin/helm")
	return bin
}

// TestRenderedConfigLoads: the config.yaml the chart renders passes the
// daemon's own strict loader, in every mode.
func TestRenderedConfigLoads(t *testing.T) {
	for _, f := range append([]string{""}, examples(t)...) {
		o := decode(t, render(t, f))
		for _, cm := range o.configMaps {
			path := filepath.Join(t.TempDir(), "config.yaml")
			os.WriteFile(path, []byte(cm.Data["config.yaml"]), 0o600)
			cmd := exec.Command("go", "run", "./cmd/toolsidecar", "check", "--references=false", "--config", path) // its files live in the pod
			cmd.Dir = "../.."
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s %s: the daemon rejects the rendered config: %v\n%s\n%s", f, cm.Name, err, out, cm.Data["config.yaml"])
			}
		}
	}
}

// TestDurableStore: with the embedded server (the default), JetStream's
// files go to a volume mounted at store_dir, since the root filesystem is
// read-only; with an external NATS there is no store volume, and the
// cluster example keeps 3 replicas.
func TestDurableStore(t *testing.T) {
	o := decode(t, render(t, ""))
	cfg := o.configMaps[0].Data["config.yaml"]
	if !strings.Contains(cfg, `store_dir: "/var/lib/toolsidecar/jetstream"`) || !strings.Contains(cfg, "enabled: true") {
		t.Errorf("default config has no durable store:\n%s", cfg)
	}
	pod := o.deployments[0].Spec.Template.Spec
	var mounted bool
	for _, m := range sidecar(t, o.deployments[0]).VolumeMounts {
		if m.Name == "toolsidecar-store" && m.MountPath == "/var/lib/toolsidecar/jetstream" && !m.ReadOnly {
			mounted = true
		}
	}
	var vol *corev1.Volume
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == "toolsidecar-store" {
			vol = &pod.Volumes[i]
		}
	}
	if !mounted || vol == nil || vol.EmptyDir == nil || vol.EmptyDir.SizeLimit.String() != "1Gi" {
		t.Errorf("store volume: mounted %v, volume %+v", mounted, vol)
	}
	ext := decode(t, render(t, "../helm/examples/external-nats.yaml"))
	for _, v := range ext.deployments[0].Spec.Template.Spec.Volumes {
		if v.Name == "toolsidecar-store" {
			t.Error("an external NATS needs no store volume")
		}
	}
	if cfg := ext.configMaps[0].Data["config.yaml"]; !strings.Contains(cfg, "replicas: 3") || strings.Contains(cfg, "store_dir") {
		t.Errorf("external cluster config:\n%s", cfg)
	}
	if off := decode(t, render(t, "", "durability.enabled=false")); strings.Contains(off.configMaps[0].Data["config.yaml"], "store_dir") {
		t.Error("durability off still configures a store")
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

// TestPodHygiene: the pods run under their own ServiceAccount without an API
// token; the sidecar's Go heap follows its memory limit (GOMEMLIMIT), a
// startup probe guards a slow start, and extra env, volumes, a PDB and a
// name override are there when asked for.
func TestPodHygiene(t *testing.T) {
	o := decode(t, render(t, ""))
	pod := o.deployments[0].Spec.Template.Spec
	if len(o.accounts) != 1 || o.accounts[0].AutomountServiceAccountToken == nil || *o.accounts[0].AutomountServiceAccountToken ||
		pod.ServiceAccountName != o.accounts[0].Name || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("service account %+v, pod account %q automount %v", o.accounts, pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	c := sidecar(t, o.deployments[0])
	var memlimit bool
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" {
			memlimit = true
		}
	}
	if !memlimit || c.StartupProbe == nil || c.StartupProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("GOMEMLIMIT from the limit %v, startup probe %+v", memlimit, c.StartupProbe)
	}
	if len(o.pdbs) != 0 {
		t.Error("a PodDisruptionBudget by default")
	}
	x := decode(t, render(t, "", "podDisruptionBudget.enabled=true", "nameOverride=tools", "sidecar.extraEnv[0].name=OTEL_SERVICE_NAME",
		"sidecar.extraEnv[0].value=assistant", "extraVolumes[0].name=scratch", "extraVolumes[0].emptyDir.medium=Memory",
		"sidecar.extraVolumeMounts[0].name=scratch", "sidecar.extraVolumeMounts[0].mountPath=/scratch"))
	if len(x.pdbs) != 1 || x.pdbs[0].Spec.MaxUnavailable == nil || x.pdbs[0].Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB %+v", x.pdbs)
	}
	xc := sidecar(t, x.deployments[0])
	if !strings.Contains(x.deployments[0].Name, "-tools") || x.deployments[0].Labels["app.kubernetes.io/name"] != "tools" {
		t.Errorf("nameOverride: deployment %q labels %v", x.deployments[0].Name, x.deployments[0].Labels)
	}
	if fmt.Sprint(xc.Env) == fmt.Sprint(c.Env) || xc.VolumeMounts[len(xc.VolumeMounts)-1].MountPath != "/scratch" {
		t.Errorf("extra env %v, mounts %v", xc.Env, xc.VolumeMounts)
	}
	vols := x.deployments[0].Spec.Template.Spec.Volumes
	if v := vols[len(vols)-1]; v.Name != "scratch" || v.EmptyDir == nil {
		t.Errorf("extra volume %+v", v)
	}
}
