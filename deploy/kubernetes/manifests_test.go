package kubernetes_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestEveryFileDecodesStrictly decodes every YAML file of the folder (every document of
// it, patches and kustomization.yaml files included) into its typed object, refusing any
// field the type does not have.
func TestEveryFileDecodesStrictly(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		objs, err := decodeAll(data, path)
		if err != nil {
			t.Error(err)
		}
		n += len(objs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("decoded %d documents, want the folder's (at least 20)", n)
	}
}

// build runs kustomize (krusty, in memory) on dir and decodes its output strictly.
func build(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	objs, err := decodeAll(out, "kustomize build "+dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestOverlaysBuildAndPass builds each region's overlay and runs every check on the result.
func TestOverlaysBuildAndPass(t *testing.T) {
	for _, r := range regions {
		t.Run(r, func(t *testing.T) {
			objs := build(t, "overlays/"+r)
			if err := check(objs); err != nil {
				t.Fatal(err)
			}
			checkRegion(t, objs, r)
		})
	}
}

// checkRegion: the overlay's region StatefulSet is region r's, end to end.
func checkRegion(t *testing.T, objs []object, r string) {
	t.Helper()
	sts := find[*appsv1.StatefulSet](t, objs, "quota-region-"+r)
	if got := sts.Spec.Selector.MatchLabels["quota.io/region"]; got != r {
		t.Errorf("StatefulSet quota-region-%s: selector's quota.io/region = %q, want %q", r, got, r)
	}
	if sts.Spec.ServiceName != "quota-region-"+r {
		t.Errorf("StatefulSet quota-region-%s: serviceName %q", r, sts.Spec.ServiceName)
	}
	cm := find[*corev1.ConfigMap](t, objs, "quota-region-"+r)
	if cm.Data["QUOTA_NAME"] != r {
		t.Errorf("ConfigMap quota-region-%s: QUOTA_NAME = %q, want %q", r, cm.Data["QUOTA_NAME"], r)
	}
	c := sts.Spec.Template.Spec.Containers[0]
	want := map[string]bool{"quota-db-region-" + r: false, "quota-certs-region-" + r: false, "quota-region-" + r: false}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			want[e.ValueFrom.SecretKeyRef.Name] = true
		}
	}
	for _, e := range c.EnvFrom {
		if e.ConfigMapRef != nil {
			want[e.ConfigMapRef.Name] = true
		}
	}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			want[v.Secret.SecretName] = true
		}
	}
	for name, used := range want {
		if !used {
			t.Errorf("StatefulSet quota-region-%s: does not use %s", r, name)
		}
	}
	for _, o := range objs {
		if strings.HasPrefix(o.Name, "quota-region") && !strings.HasSuffix(o.Name, "-"+r) {
			t.Errorf("overlay %s: %s %s: another region's name", r, o.Kind, o.Name)
		}
	}
}

// find returns the object of type T named name, failing the test when there is none.
func find[T any](t *testing.T, objs []object, name string) T {
	t.Helper()
	for _, o := range objs {
		if v, ok := o.Value.(T); ok && o.Name == name {
			return v
		}
	}
	var zero T
	t.Fatalf("no %T named %s", zero, name)
	return zero
}

// TestOperatorSecretsAreDocumented: every Secret the manifests may leave to the operator is
// made by a `kubectl create secret generic NAME` line of README.md, for every region.
func TestOperatorSecretsAreDocumented(t *testing.T) {
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	for _, s := range operatorSecrets {
		if !strings.Contains(s, "%s") {
			if !strings.Contains(readme, "kubectl -n quota create secret generic "+s+" ") {
				t.Errorf("README.md: no `kubectl -n quota create secret generic %s` line", s)
			}
			continue
		}
		generic := strings.ReplaceAll(s, "%s", "$r")
		if !strings.Contains(readme, "kubectl -n quota create secret generic "+generic+" ") {
			t.Errorf("README.md: no `kubectl -n quota create secret generic %s` line (for r in %v)", generic, regions)
		}
	}
}
