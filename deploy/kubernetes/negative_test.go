package kubernetes_test

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestMisspelledFieldFails: a field the type does not have is an error naming it, at the
// top, deep in a pod template, and in a kustomization.
func TestMisspelledFieldFails(t *testing.T) {
	for _, tc := range []struct{ doc, field string }{
		{"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n", "replica"},
		{"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports:\n    - name: grpc\n      port: 1\n      targetPorts: grpc\n", "targetPorts"},
		{"apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          securityContext: {readOnlyRootFileSystem: true}\n", "readOnlyRootFileSystem"},
		{"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  clusterIP: None\n  clusterIP: 10.0.0.1\n", "clusterIP"},
		{"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresource: [a.yaml]\n", "resource"},
	} {
		_, err := decodeAll([]byte(tc.doc), "bad.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("decoding a document with %q: %v, want an error naming the field", tc.field, err)
		}
	}
	if _, err := decodeAll([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"), "pod.yaml"); err == nil {
		t.Error("a kind the checks do not know decoded without error")
	}
}

// TestChecksCatch: each check fails on the us overlay with one thing broken.
func TestChecksCatch(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		breakIt    func(t *testing.T, objs []object)
	}{
		{"selector misses template", "does not match the pod template", func(t *testing.T, o []object) {
			find[*appsv1.Deployment](t, o, "quota-coordinator").Spec.Selector.MatchLabels["app.kubernetes.io/component"] = "coord"
		}},
		{"service port name", "targetPort grcp", func(t *testing.T, o []object) {
			find[*corev1.Service](t, o, "quota-region-us").Spec.Ports[0].TargetPort = intstr.FromString("grcp")
		}},
		{"probe port", "the container has no such port", func(t *testing.T, o []object) {
			regionContainer(t, o).ReadinessProbe.TCPSocket.Port = intstr.FromString("health")
		}},
		{"undefined secret", `Secret "quota-db-region-mars"`, func(t *testing.T, o []object) {
			for _, e := range regionContainer(t, o).Env {
				if e.Name == "QUOTA_DB_URL" {
					e.ValueFrom.SecretKeyRef.Name = "quota-db-region-mars"
				}
			}
		}},
		{"undefined configmap", `ConfigMap "quota-region"`, func(t *testing.T, o []object) {
			regionContainer(t, o).EnvFrom[1].ConfigMapRef.Name = "quota-region"
		}},
		{"pdb matches nothing", "matches 0 workloads", func(t *testing.T, o []object) {
			find[*policyv1.PodDisruptionBudget](t, o, "quota-region-us").Spec.Selector.MatchLabels["quota.io/region"] = "eu"
		}},
		{"second image", "2 images", func(t *testing.T, o []object) { regionContainer(t, o).Image = "quotaworks/quotad:0.2.0" }},
		{"writable root", "readOnlyRootFilesystem", func(t *testing.T, o []object) {
			*regionContainer(t, o).SecurityContext.ReadOnlyRootFilesystem = false
		}},
		{"env order", "$(POD_IP) is not defined before it", func(t *testing.T, o []object) {
			c := regionContainer(t, o)
			for i, e := range c.Env {
				if e.Name == "POD_IP" {
					c.Env = append(append(c.Env[:i:i], c.Env[i+1:]...), e) // POD_IP last
					break
				}
			}
		}},
		{"anti-affinity of another region", "anti-affinity", func(t *testing.T, o []object) {
			s := find[*appsv1.StatefulSet](t, o, "quota-region-us")
			s.Spec.Template.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector.MatchLabels["quota.io/region"] = "eu"
		}},
		{"advertise the pod IP", "not the pod's stable name", func(t *testing.T, o []object) {
			c := regionContainer(t, o)
			for i, e := range c.Env {
				if e.Name == "QUOTA_ADVERTISE" {
					c.Env[i].Value = "$(POD_IP):7401"
				}
			}
		}},
		{"advertise another region's name", "not the pod's stable name", func(t *testing.T, o []object) {
			find[*corev1.ConfigMap](t, o, "quota-region-us").Data["QUOTA_NAME"] = "eu"
		}},
		{"governing service", `serviceName "quota-region"`, func(t *testing.T, o []object) {
			find[*appsv1.StatefulSet](t, o, "quota-region-us").Spec.ServiceName = "quota-region"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := build(t, "overlays/us")
			tc.breakIt(t, objs)
			err := check(objs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// regionContainer is the us overlay's region container.
func regionContainer(t *testing.T, objs []object) *corev1.Container {
	t.Helper()
	return &find[*appsv1.StatefulSet](t, objs, "quota-region-us").Spec.Template.Spec.Containers[0]
}
