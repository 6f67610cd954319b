// Package quota_test holds the test that keeps the folders honest: the import rules of the
// layout (docs/architecture.md, "Layers"), for production code and tests alike, read from
// `go list` and checked on every build.
package quota_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/quotaworks/quota"

// layer names a group of packages and what each may import from the project (other than
// itself). A package belongs to the first layer whose prefix matches it.
type layer struct {
	name string
	// match reports whether a package (path relative to the module) is in the layer.
	match func(pkg string) bool
	// may lists the project prefixes this layer's production code may import.
	may []string
	// testMay lists what the layer's tests (in-package and external) may import beyond what
	// its production code may, its own package and internal/ (see testViolations).
	testMay []string
}

// layers is the one table of import rules: cmd → coordinator/region → transfer/fencing →
// proto/internal. Adapters (coordrpc, regionrpc) are the only packages below cmd that speak
// proto as servers; process wiring lives under cmd/. The load generator (loadgen) is the
// storefront's side of the same APIs: a client of the regions' gRPC and HTTP/JSON edges that
// counts units as transfer.Units, so it may import proto/ and transfer like an adapter, and
// nothing of coordinator, region or fencing; it is a layer of its own, not internal/, because
// internal/ helpers import nothing but each other, and not under cmd/, because the chaos suite
// (deploy/) runs it too.
//
// Tests are held to the same table: a package's tests may import what its production code
// may, the package itself (an external test) and any internal/ package (the test helpers:
// testpg, testcerts, testnet, ...), and nothing above their package; only fencing's tests
// import etcd, while any test may do I/O (noIO is for production code). One layer's tests may
// import more, its testMay, each with its reason:
//   - internal/ -> proto/: proto is the other half of the bottom layer, generated code that
//     imports nothing of the project, so a helper's test that takes the project's services
//     and messages as its input points no arrow up; rpcserve's tests serve every RPC to check
//     the role table (internal/trust) against each one and its UTF-8 codec against real
//     requests. A helper's production code stays message-agnostic: one that knew the
//     messages would be an adapter.
//   - coordinator/coordrpc -> region, region/regionrpc: the Participant client is a client of
//     the region adapter's server; its tests run it against real regions served as quotad
//     serves them, so a mapping that disagrees with the server's is caught. Sideways, between
//     the two adapters, and only in tests: the coordinator adapter's production code still
//     speaks to regions through proto alone.
//
// There are no exceptions: a package that needs an import the table forbids moves (a test
// moves to the package whose behaviour it checks), or the table gains a rule with its reason.
var layers = []layer{
	{"commands", prefix("cmd/"), []string{"cmd/", "coordinator", "region", "admission", "transfer", "fencing", "loadgen", "proto/", "internal/"}, nil},
	{"simulation", prefix("sim"), []string{"coordinator", "region", "transfer", "internal/"}, nil},
	{"harness", prefix("deploy/"), []string{"loadgen", "internal/", "proto/", "transfer"}, nil},
	{"load generator", prefix("loadgen"), []string{"proto/", "transfer", "internal/"}, nil},
	{"coordinator adapter", prefix("coordinator/coordrpc"), []string{"coordinator", "proto/", "transfer", "internal/"},
		[]string{"region", "region/regionrpc"}},
	{"coordinator HTTP adapter", prefix("coordinator/coordhttp"), []string{"coordinator", "admission", "transfer", "internal/"}, nil},
	{"region storefront edge", prefix("region/regionedge"), []string{"region", "region/regionhttp", "region/regionrpc", "admission", "proto/", "transfer", "internal/"}, nil},
	{"region HTTP adapter", prefix("region/regionhttp"), []string{"region", "admission", "transfer", "internal/"}, nil},
	{"region adapter", prefix("region/regionrpc"), []string{"region", "admission", "proto/", "transfer", "internal/"}, nil},
	{"coordinator", prefix("coordinator"), []string{"transfer", "fencing", "internal/"}, nil},
	{"region", prefix("region"), []string{"admission", "transfer", "fencing", "internal/"}, nil},
	{"fencing", prefix("fencing"), []string{"transfer", "internal/"}, nil},
	{"transfer", prefix("transfer"), []string{"internal/"}, nil},
	{"admission", prefix("admission"), []string{"transfer", "internal/"}, nil},
	{"proto", prefix("proto/"), nil, nil},
	{"internal", prefix("internal/"), []string{"internal/"}, []string{"proto/"}},
}

// noIO is what transfer and admission (pure rules) may not import from the standard library.
var noIO = []string{"os", "os/exec", "net", "net/http", "database/sql", "syscall", "io/ioutil", "log", "log/slog", "io/fs"}

// prefix matches a package and everything under it: "region" matches region and
// region/regionrpc, not regions.
func prefix(p string) func(string) bool {
	base := strings.TrimSuffix(p, "/")
	return func(pkg string) bool { return pkg == base || strings.HasPrefix(pkg, base+"/") }
}

type listed struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func goList(t *testing.T) []listed {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; expected the whole tree", len(pkgs))
	}
	return pkgs
}

func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

func layerOf(pkg string) (layer, bool) {
	for _, l := range layers {
		if l.match(pkg) {
			return l, true
		}
	}
	return layer{}, false
}

// violations returns every forbidden import of one package: of its production code
// (Imports) and of its tests (TestImports, XTestImports).
func violations(p listed) []string {
	pkg, _ := rel(p.ImportPath)
	if pkg == "" { // this test's own package
		return nil
	}
	l, ok := layerOf(pkg)
	if !ok {
		return []string{fmt.Sprintf("%s: in no layer of the import rules; add it to the table", pkg)}
	}
	tests := slices.Concat(p.TestImports, p.XTestImports)
	slices.Sort(tests)
	return append(prodViolations(pkg, l, p.Imports), testViolations(pkg, l, slices.Compact(tests))...)
}

// prodViolations returns the forbidden imports of package pkg's production code.
func prodViolations(pkg string, l layer, imports []string) []string {
	var bad []string
	for _, imp := range imports {
		if strings.HasPrefix(imp, "go.etcd.io/") && l.name != "fencing" {
			bad = append(bad, fmt.Sprintf("%s -> %s (only fencing imports etcd)", pkg, imp))
		}
		if (l.name == "transfer" || l.name == "admission") && (slices.Contains(noIO, imp) || strings.Contains(strings.SplitN(imp, "/", 2)[0], ".")) && !strings.HasPrefix(imp, module) {
			bad = append(bad, fmt.Sprintf("%s -> %s (transfer does no I/O and has no dependencies)", pkg, imp))
		}
		if r, ours := rel(imp); ours && r != pkg && !allowed(l.may, r) {
			bad = append(bad, fmt.Sprintf("%s -> %s (%s may import only %v)", pkg, r, l.name, l.may))
		}
	}
	return bad
}

// testViolations returns the forbidden imports of package pkg's tests: only fencing's import
// etcd, and each imports from the project only its own package, what its production code may,
// internal/ and its layer's testMay. Tests may do I/O (noIO is for production code).
func testViolations(pkg string, l layer, imports []string) []string {
	may := slices.Concat(l.may, l.testMay)
	if !slices.Contains(may, "internal/") {
		may = append(may, "internal/")
	}
	var bad []string
	for _, imp := range imports {
		if strings.HasPrefix(imp, "go.etcd.io/") && l.name != "fencing" {
			bad = append(bad, fmt.Sprintf("%s's tests -> %s (only fencing imports etcd)", pkg, imp))
		}
		if r, ours := rel(imp); ours && r != pkg && !allowed(may, r) {
			bad = append(bad, fmt.Sprintf("%s's tests -> %s (%s's tests may import only %v)", pkg, r, l.name, may))
		}
	}
	return bad
}

// allowed reports whether project package r is under one of the prefixes may.
func allowed(may []string, r string) bool {
	return slices.ContainsFunc(may, func(m string) bool { return prefix(m)(r) })
}

// TestImportRules checks every package's imports, and its tests', against the layers.
func TestImportRules(t *testing.T) {
	for _, p := range goList(t) {
		for _, v := range violations(p) {
			t.Errorf("import rule broken: %s", v)
		}
	}
}

// TestImportRulesCatchViolations plants forbidden imports and expects each to be reported, so
// the rule table cannot silently match nothing.
func TestImportRulesCatchViolations(t *testing.T) {
	cases := []listed{
		{ImportPath: module + "/region", Imports: []string{module + "/proto/quota/v1"}},
		{ImportPath: module + "/region", Imports: []string{module + "/coordinator"}},
		{ImportPath: module + "/coordinator", Imports: []string{"go.etcd.io/etcd/client/v3"}},
		{ImportPath: module + "/transfer", Imports: []string{"net"}},
		{ImportPath: module + "/transfer", Imports: []string{module + "/fencing"}},
		{ImportPath: module + "/internal/clock", Imports: []string{module + "/region"}},
		{ImportPath: module + "/sim", Imports: []string{module + "/cmd/internal/cluster"}},
		{ImportPath: module + "/fencing", Imports: []string{module + "/region"}},
		{ImportPath: module + "/newpkg", Imports: nil},
		{ImportPath: module + "/coordinator", Imports: []string{module + "/coordinator/coordrpc"}},
		{ImportPath: module + "/loadgen", Imports: []string{module + "/region"}},
		{ImportPath: module + "/loadgen", Imports: []string{module + "/coordinator"}},
		{ImportPath: module + "/loadgen", Imports: []string{module + "/cmd/internal/cluster"}},
		{ImportPath: module + "/region", Imports: []string{module + "/loadgen"}},
		{ImportPath: module + "/sim", Imports: []string{module + "/loadgen"}},
		{ImportPath: module + "/internal/apierr", Imports: []string{module + "/proto/quota/v1"}},
		// Tests: an arrow up, proto where the production code may not have it, etcd.
		{ImportPath: module + "/internal/pgutil", XTestImports: []string{module + "/region"}},
		{ImportPath: module + "/region", XTestImports: []string{module + "/proto/quota/v1"}},
		{ImportPath: module + "/transfer", TestImports: []string{module + "/fencing"}},
		{ImportPath: module + "/sim", XTestImports: []string{module + "/loadgen"}},
		{ImportPath: module + "/region", TestImports: []string{"go.etcd.io/etcd/client/v3"}},
	}
	for _, c := range cases {
		if len(violations(c)) == 0 {
			t.Errorf("%+v: not reported", c)
		}
	}
	for _, ok := range []listed{
		{ImportPath: module + "/region/regionrpc", Imports: []string{module + "/region", module + "/proto/quota/v1", "google.golang.org/grpc"}},
		{ImportPath: module + "/loadgen", Imports: []string{module + "/proto/quota/v1", module + "/transfer", module + "/internal/apierr"}},
		{ImportPath: module + "/deploy/local", Imports: []string{module + "/loadgen"}},
		{ImportPath: module + "/internal/rpcserve", TestImports: []string{module + "/proto/quota/v1"},
			XTestImports: []string{module + "/internal/rpcserve", module + "/internal/testcerts"}},
		{ImportPath: module + "/region", XTestImports: []string{module + "/region", module + "/internal/testpg", module + "/fencing"}},
		{ImportPath: module + "/transfer", TestImports: []string{"os", "net"}},
		{ImportPath: module + "/fencing", XTestImports: []string{"go.etcd.io/etcd/client/v3"}},
	} {
		if v := violations(ok); len(v) != 0 {
			t.Errorf("an allowed import was reported: %v", v)
		}
	}
}
