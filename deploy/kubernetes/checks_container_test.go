package kubernetes_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// portName is the API server's IANA_SVC_NAME: at most 15 lower-case letters, digits and
// dashes, with a letter, not starting or ending with a dash.
var portName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$`)

// envRef is a $(VAR) reference in an env value or an argument.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func checkContainer(w workload, c corev1.Container) []error {
	where := fmt.Sprintf("%s %s container %s", w.Kind, w.Name, c.Name)
	var errs []error
	for _, p := range c.Ports {
		if !portName.MatchString(p.Name) || !strings.ContainsAny(p.Name, "abcdefghijklmnopqrstuvwxyz") {
			errs = append(errs, fmt.Errorf("%s: port name %q: want an IANA service name (up to 15 of a-z, 0-9, -)", where, p.Name))
		}
	}
	for what, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe} {
		if p == nil {
			if what == "readinessProbe" {
				errs = append(errs, fmt.Errorf("%s: no readinessProbe", where))
			}
			continue
		}
		errs = append(errs, checkProbe(where+" "+what, p, c))
	}
	errs = append(errs, checkContainerSecurity(where, c), checkResources(where, c), checkEnvRefs(where, c))
	return errs
}

// hasPort tells whether a container has port p, by name or by number.
func hasPort(c corev1.Container, p intstr.IntOrString) bool {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return true
		}
	}
	return false
}

func checkProbe(where string, p *corev1.Probe, c corev1.Container) error {
	var port intstr.IntOrString
	switch {
	case p.TCPSocket != nil:
		port = p.TCPSocket.Port
	case p.HTTPGet != nil:
		port = p.HTTPGet.Port
	case p.GRPC != nil:
		port = intstr.FromInt32(p.GRPC.Port)
	default:
		return nil // exec: no port
	}
	if !hasPort(c, port) {
		return fmt.Errorf("%s: port %s: the container has no such port", where, port.String())
	}
	return nil
}

// checkContainerSecurity: the restricted Pod Security Standard's container fields, and a
// read-only root file system.
func checkContainerSecurity(where string, c corev1.Container) error {
	sc := c.SecurityContext
	switch {
	case sc == nil:
		return fmt.Errorf("%s: no securityContext", where)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		return fmt.Errorf("%s: securityContext.readOnlyRootFilesystem: want true", where)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		return fmt.Errorf("%s: securityContext.allowPrivilegeEscalation: want false", where)
	case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) > 0:
		return fmt.Errorf("%s: securityContext.capabilities: want drop [ALL] and nothing added", where)
	}
	return nil
}

// checkResources: CPU and memory requested, and a memory limit at least the request.
func checkResources(where string, c corev1.Container) error {
	r := c.Resources
	cpu, mem, lim := r.Requests[corev1.ResourceCPU], r.Requests[corev1.ResourceMemory], r.Limits[corev1.ResourceMemory]
	if cpu.IsZero() || mem.IsZero() || lim.IsZero() {
		return fmt.Errorf("%s: resources: want requests of cpu and memory and a memory limit", where)
	}
	if lim.Cmp(mem) < 0 {
		return fmt.Errorf("%s: resources: memory limit %s below the request %s", where, lim.String(), mem.String())
	}
	return nil
}

// checkEnvRefs: a $(VAR) in an env value or argument names a variable defined before it
// (the kubelet otherwise passes the text through unexpanded).
func checkEnvRefs(where string, c corev1.Container) error {
	defined := map[string]bool{}
	var errs []error
	use := func(what, s string) {
		for _, m := range envRef.FindAllStringSubmatch(s, -1) {
			if !defined[m[1]] {
				errs = append(errs, fmt.Errorf("%s: %s: $(%s) is not defined before it", where, what, m[1]))
			}
		}
	}
	for _, e := range c.Env {
		use("env "+e.Name, e.Value)
		defined[e.Name] = true
	}
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		use("command", a)
	}
	return errors.Join(errs...)
}

// secretOrConfigMap checks that a referenced Secret or ConfigMap exists in objs, or (a
// Secret) is one the operator makes; optional references may be missing.
func secretOrConfigMap(where, kind, name string, optional *bool, objs []object) error {
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			return nil
		}
	}
	if (kind == "Secret" && operatorMade(name)) || (optional != nil && *optional) {
		return nil
	}
	return fmt.Errorf("%s: %s %q: not in the manifests nor among the operator's Secrets (README.md)", where, kind, name)
}

func checkRefs(w workload, c corev1.Container, objs []object) []error {
	where := fmt.Sprintf("%s %s container %s", w.Kind, w.Name, c.Name)
	var errs []error
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil {
			errs = append(errs, secretOrConfigMap(where+" envFrom", "Secret", e.SecretRef.Name, e.SecretRef.Optional, objs))
		}
		if e.ConfigMapRef != nil {
			errs = append(errs, secretOrConfigMap(where+" envFrom", "ConfigMap", e.ConfigMapRef.Name, e.ConfigMapRef.Optional, objs))
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			continue
		}
		if r := e.ValueFrom.SecretKeyRef; r != nil {
			errs = append(errs, secretOrConfigMap(where+" env "+e.Name, "Secret", r.Name, r.Optional, objs))
		}
		if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
			errs = append(errs, secretOrConfigMap(where+" env "+e.Name, "ConfigMap", r.Name, r.Optional, objs))
		}
	}
	mounted := map[string]bool{}
	for _, v := range w.Pod.Volumes {
		mounted[v.Name] = true
	}
	for _, m := range c.VolumeMounts {
		if !mounted[m.Name] {
			errs = append(errs, fmt.Errorf("%s: volumeMount %s: no such volume", where, m.Name))
		}
	}
	return errs
}

func checkVolumes(w workload, objs []object) []error {
	var errs []error
	for _, v := range w.Pod.Volumes {
		where := fmt.Sprintf("%s %s volume %s", w.Kind, w.Name, v.Name)
		if s := v.Secret; s != nil {
			errs = append(errs, secretOrConfigMap(where, "Secret", s.SecretName, s.Optional, objs))
		}
		if cm := v.ConfigMap; cm != nil {
			errs = append(errs, secretOrConfigMap(where, "ConfigMap", cm.Name, cm.Optional, objs))
		}
	}
	return errs
}

// checkService: a Service selects some workload's pods, and every port it targets (by name
// or number) is a port of every selected workload's containers.
func checkService(s *corev1.Service, ws []workload) []error {
	var errs []error
	matched := 0
	for _, w := range ws {
		if ok, _ := selects(&metav1.LabelSelector{MatchLabels: s.Spec.Selector}, w.Labels); !ok {
			continue
		}
		matched++
		for _, p := range s.Spec.Ports {
			if !podHasPort(w.Pod, p.TargetPort) {
				errs = append(errs, fmt.Errorf("Service %s port %s: targetPort %s is no port of %s %s's containers",
					s.Name, p.Name, p.TargetPort.String(), w.Kind, w.Name))
			}
		}
	}
	if matched == 0 {
		errs = append(errs, fmt.Errorf("Service %s: selector %v selects no workload's pods", s.Name, s.Spec.Selector))
	}
	for _, p := range s.Spec.Ports {
		if len(s.Spec.Ports) > 1 && p.Name == "" {
			errs = append(errs, fmt.Errorf("Service %s: port %d: a Service of several ports names each", s.Name, p.Port))
		}
	}
	return errs
}

func podHasPort(pod *corev1.PodSpec, p intstr.IntOrString) bool {
	for _, c := range pod.Containers {
		if hasPort(c, p) {
			return true
		}
	}
	return false
}

// checkPDB: a PodDisruptionBudget's selector matches exactly one workload's pods.
func checkPDB(p *policyv1.PodDisruptionBudget, ws []workload) []error {
	var matched []string
	for _, w := range ws {
		if ok, _ := selects(p.Spec.Selector, w.Labels); ok {
			matched = append(matched, w.Kind+" "+w.Name)
		}
	}
	if len(matched) != 1 {
		return []error{fmt.Errorf("PodDisruptionBudget %s: selector %v matches %d workloads %v, want 1", p.Name, p.Spec.Selector, len(matched), matched)}
	}
	return nil
}

// imageName is an image reference without its tag or digest.
func imageName(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}

// checkImages: every container runs the same image (one quotad build), at the same tag.
func checkImages(ws []workload) error {
	seen := map[string]string{}
	for _, w := range ws {
		for _, c := range w.Pod.Containers {
			seen[c.Image] = w.Kind + " " + w.Name
		}
	}
	if len(seen) > 1 {
		return fmt.Errorf("containers run %d images, want one: %v", len(seen), seen)
	}
	for ref := range seen {
		if imageName(ref) == ref {
			return fmt.Errorf("image %s: no tag (the base's images: entry sets it)", ref)
		}
	}
	return nil
}

// checkUniqueNames: no two objects of one kind share a name.
func checkUniqueNames(objs []object) error {
	seen := map[string]string{}
	var errs []error
	for _, o := range objs {
		k := o.Kind + "/" + o.Name
		if prev, ok := seen[k]; ok {
			errs = append(errs, fmt.Errorf("%s: defined twice (%s, %s)", k, prev, o.Source))
		}
		seen[k] = o.Source
	}
	return errors.Join(errs...)
}
