package kubernetes_test

import (
	"errors"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// operatorSecrets are the Secrets an operator makes with kubectl create secret (README.md,
// "Secrets"): key material and database passwords are never in the manifests. %s is a
// region's name.
var operatorSecrets = []string{
	"quota-certs-coordinator", "quota-db-coordinator", "quota-coordinator-regions", "quota-ticket-keys",
	"quota-certs-region-%s", "quota-db-region-%s",
}

// regions are the regions with an overlay.
var regions = []string{"us", "eu", "ap"}

// operatorMade tells whether a Secret name is one of operatorSecrets.
func operatorMade(name string) bool {
	for _, s := range operatorSecrets {
		for _, r := range regions {
			if name == strings.ReplaceAll(s, "%s", r) {
				return true
			}
		}
	}
	return false
}

// workload is a Deployment's or StatefulSet's pods.
type workload struct {
	Kind, Name  string
	Selector    *metav1.LabelSelector
	Labels      map[string]string
	Pod         *corev1.PodSpec
	ServiceName string // a StatefulSet's governing Service
}

func workloads(objs []object) []workload {
	var out []workload
	for _, o := range objs {
		switch v := o.Value.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{"Deployment", v.Name, v.Spec.Selector, v.Spec.Template.Labels, &v.Spec.Template.Spec, ""})
		case *appsv1.StatefulSet:
			out = append(out, workload{"StatefulSet", v.Name, v.Spec.Selector, v.Spec.Template.Labels, &v.Spec.Template.Spec, v.Spec.ServiceName})
		}
	}
	return out
}

// check runs every check on a built set of objects and returns every problem found.
func check(objs []object) error {
	ws := workloads(objs)
	var errs []error
	for _, w := range ws {
		errs = append(errs, checkWorkload(w, objs)...)
	}
	for _, o := range objs {
		switch v := o.Value.(type) {
		case *corev1.Service:
			errs = append(errs, checkService(v, ws)...)
		case *policyv1.PodDisruptionBudget:
			errs = append(errs, checkPDB(v, ws)...)
		}
	}
	errs = append(errs, checkImages(ws), checkUniqueNames(objs))
	return errors.Join(errs...)
}

// selects tells whether selector sel matches the pod labels lbls (an empty or missing
// selector matches nothing here: every selector of these manifests names labels).
func selects(sel *metav1.LabelSelector, lbls map[string]string) (bool, error) {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return false, nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, err
	}
	return s.Matches(labels.Set(lbls)), nil
}

func checkWorkload(w workload, objs []object) []error {
	var errs []error
	if ok, err := selects(w.Selector, w.Labels); err != nil || !ok {
		errs = append(errs, fmt.Errorf("%s %s: selector %v does not match the pod template's labels %v (%v)", w.Kind, w.Name, w.Selector, w.Labels, err))
	}
	if w.Kind == "StatefulSet" {
		errs = append(errs, checkGoverningService(w, objs), checkAdvertise(w, objs))
	}
	errs = append(errs, checkAntiAffinity(w), checkPodSecurity(w))
	for _, c := range w.Pod.Containers {
		errs = append(errs, checkContainer(w, c)...)
		errs = append(errs, checkRefs(w, c, objs)...)
	}
	errs = append(errs, checkVolumes(w, objs)...)
	return errs
}

// checkGoverningService: a StatefulSet's serviceName is a headless Service selecting its pods.
func checkGoverningService(w workload, objs []object) error {
	for _, o := range objs {
		s, ok := o.Value.(*corev1.Service)
		if !ok || s.Name != w.ServiceName {
			continue
		}
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			return fmt.Errorf("StatefulSet %s: Service %s is not headless (clusterIP: None)", w.Name, s.Name)
		}
		if ok, err := selects(&metav1.LabelSelector{MatchLabels: s.Spec.Selector}, w.Labels); err != nil || !ok {
			return fmt.Errorf("StatefulSet %s: Service %s does not select its pods", w.Name, s.Name)
		}
		return nil
	}
	return fmt.Errorf("StatefulSet %s: serviceName %q: no such Service", w.Name, w.ServiceName)
}

// checkAntiAffinity: the pods of one workload never share a node (required, by hostname,
// with a selector that matches the workload's own pods).
func checkAntiAffinity(w workload) error {
	a := w.Pod.Affinity
	if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		return fmt.Errorf("%s %s: no required pod anti-affinity", w.Kind, w.Name)
	}
	for _, t := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		ok, err := selects(t.LabelSelector, w.Labels)
		if t.TopologyKey == "kubernetes.io/hostname" && err == nil && ok {
			return nil
		}
	}
	return fmt.Errorf("%s %s: no anti-affinity term by kubernetes.io/hostname that selects its own pods", w.Kind, w.Name)
}

// checkPodSecurity: the restricted Pod Security Standard's pod-level fields.
func checkPodSecurity(w workload) error {
	sc := w.Pod.SecurityContext
	switch {
	case sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		return fmt.Errorf("%s %s: pod securityContext.runAsNonRoot: want true", w.Kind, w.Name)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		return fmt.Errorf("%s %s: pod securityContext.seccompProfile: want RuntimeDefault", w.Kind, w.Name)
	}
	return nil
}

// checkAdvertise: a StatefulSet whose container publishes an address (QUOTA_ADVERTISE)
// publishes its pod's stable name under its governing Service, <statefulset>-<i>.<service>,
// at the container's grpc port: the name node.crt's --host '*.<service>' covers. It expands
// the value as the kubelet would for pod 0, with POD_NAME from the downward API and the
// other variables from the ConfigMap keys they reference.
func checkAdvertise(w workload, objs []object) error {
	for _, c := range w.Pod.Containers {
		vars := map[string]string{}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
				vars[e.Name] = w.Name + "-0"
			case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
				vars[e.Name] = configMapValue(objs, e.ValueFrom.ConfigMapKeyRef.Name, e.ValueFrom.ConfigMapKeyRef.Key)
			case e.Name == "QUOTA_ADVERTISE":
				got := envRef.ReplaceAllStringFunc(e.Value, func(ref string) string { return vars[envRef.FindStringSubmatch(ref)[1]] })
				want := fmt.Sprintf("%s-0.%s:%d", w.Name, w.ServiceName, containerPort(c, "grpc"))
				if got != want {
					return fmt.Errorf("%s %s container %s: QUOTA_ADVERTISE %q is %q for pod 0, not the pod's stable name and grpc port %q",
						w.Kind, w.Name, c.Name, e.Value, got, want)
				}
			}
		}
	}
	return nil
}

// configMapValue is key's value in ConfigMap name of objs ("" when there is none).
func configMapValue(objs []object, name, key string) string {
	for _, o := range objs {
		if cm, ok := o.Value.(*corev1.ConfigMap); ok && cm.Name == name {
			return cm.Data[key]
		}
	}
	return ""
}

// containerPort is the number of c's port named name (0 when there is none).
func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}
