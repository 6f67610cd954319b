// Package testshape keeps a package's parts small: a test of the package calls Check, and a
// type that grows past the limits fails it (a type with one job each, not one that does
// everything).
package testshape

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// The limits Check holds a package to.
const (
	MaxMethods   = 30
	MaxFields    = 15
	MaxFileLines = 600
)

// Check counts, in the production files of the package in dir, each type's declared
// methods and fields and each file's lines against the limits: at most MaxMethods methods
// and MaxFields fields per type (an embedded field counts one; methods it promotes are its
// type's), at most MaxFileLines lines per file.
func Check(t testing.TB, dir string) {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]int{}
	for _, p := range pkgs {
		for name, f := range p.Files {
			if n := fset.Position(f.FileEnd).Line; n > MaxFileLines {
				t.Errorf("%s has %d lines, more than %d", name, n, MaxFileLines)
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
		t.Fatal("found no methods: is dir a Go package?")
	}
	for typ, n := range methods {
		if n > MaxMethods {
			t.Errorf("type %s has %d methods, more than %d", typ, n, MaxMethods)
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

// checkFields reports each struct type of d with more than MaxFields fields.
func checkFields(t testing.TB, d *ast.GenDecl) {
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
		if n > MaxFields {
			t.Errorf("type %s has %d fields, more than %d", ts.Name.Name, n, MaxFields)
		}
	}
}
