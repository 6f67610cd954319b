// Package kubernetes_test checks the Kubernetes manifests of deploy/kubernetes offline: every
// YAML file decodes strictly into its typed API object, every overlay builds with kustomize
// (krusty, in memory), and the built objects pass the checks the API server, the kubelet or
// kubectl would otherwise make only at apply time (checks_test.go).
package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"
)

// object is one decoded manifest: its kind, name, where it came from and the typed value.
type object struct {
	Kind, Name, Source string
	Value              any
}

// maxDocs bounds the documents of one file or one build.
const maxDocs = 200

// docSeparator is a YAML document separator line.
var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitDocs splits a multi-document YAML stream, dropping documents of only comments.
func splitDocs(data []byte) ([][]byte, error) {
	var docs [][]byte
	for _, d := range docSeparator.Split(string(data), -1) {
		if isBlank(d) {
			continue
		}
		if len(docs) == maxDocs {
			return nil, fmt.Errorf("more than %d documents", maxDocs)
		}
		docs = append(docs, []byte(d))
	}
	return docs, nil
}

// isBlank tells whether a YAML document holds only blank lines and comments.
func isBlank(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// newTyped returns a pointer to the typed object of apiVersion and kind, or an error naming
// both for a kind these manifests do not use.
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "kustomize.config.k8s.io/v1beta1 Kustomization", "kustomize.config.k8s.io/v1alpha1 Component":
		return &types.Kustomization{}, nil
	}
	return nil, fmt.Errorf("apiVersion %q kind %q: not a kind these manifests use (add it to newTyped)", apiVersion, kind)
}

// decodeStrict decodes one YAML document into its typed object; a field the type does not
// have (a misspelling) is an error, as is trailing data.
func decodeStrict(doc []byte, source string) (object, error) {
	js, err := yaml.YAMLToJSONStrict(doc) // a key given twice is an error
	if err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	v, err := newTyped(tm.APIVersion, tm.Kind)
	if err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return object{}, fmt.Errorf("%s: %s: %w", source, tm.Kind, err)
	}
	if dec.More() {
		return object{}, fmt.Errorf("%s: %s: trailing data after the object", source, tm.Kind)
	}
	// encoding/json matches field names case-insensitively, so readOnlyRootFileSystem would
	// pass for readOnlyRootFilesystem and be dropped by the API server; decode again as the
	// API server does: case-sensitively, refusing unknown and duplicate fields.
	strict, err := kjson.UnmarshalStrict(js, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return object{}, fmt.Errorf("%s: %s: %w", source, tm.Kind, err)
	}
	if len(strict) > 0 {
		return object{}, fmt.Errorf("%s: %s: %w", source, tm.Kind, errors.Join(strict...))
	}
	name := ""
	if m, ok := v.(metav1.Object); ok {
		name = m.GetName()
	}
	return object{Kind: tm.Kind, Name: name, Source: source, Value: v}, nil
}

// decodeAll decodes every document of a YAML stream strictly.
func decodeAll(data []byte, source string) ([]object, error) {
	docs, err := splitDocs(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	var out []object
	for i, d := range docs {
		o, err := decodeStrict(d, fmt.Sprintf("%s#%d", source, i+1))
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}
