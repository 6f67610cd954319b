package coordinator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// The package's parts stay small: the Coordinator is a facade over a few types with one
// job each (coordinator.go names them), not one type that does everything.
const (
	maxMethodsPerType = 30
	maxFieldsPerType  = 15
	maxFileLines      = 600
)

// TestPartsStaySmall counts, in the package's production files, each type's methods and
// fields and each file's lines against the limits above.
func TestPartsStaySmall(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]int{}
	for _, p := range pkgs {
		for name, f := range p.Files {
			if n := fset.Position(f.FileEnd).Line; n > maxFileLines {
				t.Errorf("%s has %d lines, more than %d", name, n, maxFileLines)
			}
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if d.Recv != nil {
						methods[receiverType(d.Recv.List[0].Type)]++
					}
				case *ast.GenDecl:
					checkFields(t, d)
				}
			}
		}
	}
	if len(methods) == 0 {
		t.Fatal("found no methods: is the test running in the package directory?")
	}
	for typ, n := range methods {
		if n > maxMethodsPerType {
			t.Errorf("type %s has %d methods, more than %d", typ, n, maxMethodsPerType)
		}
	}
}

// receiverType is the name of a method receiver's type (T or *T).
func receiverType(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// checkFields reports each struct type of d with more than maxFieldsPerType fields.
func checkFields(t *testing.T, d *ast.GenDecl) {
	t.Helper()
	for _, s := range d.Specs {
		ts, ok := s.(*ast.TypeSpec)
		if !ok {
			continue
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			continue
		}
		n := 0
		for _, f := range st.Fields.List {
			n += max(len(f.Names), 1)
		}
		if n > maxFieldsPerType {
			t.Errorf("type %s has %d fields, more than %d", ts.Name.Name, n, maxFieldsPerType)
		}
	}
}
