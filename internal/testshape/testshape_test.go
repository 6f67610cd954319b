package testshape

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what Check reports instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatal(args ...any) { r.errs = append(r.errs, fmt.Sprint(args...)) }

// TestCheckReportsEachLimit: a type one method or one field past its limit and a file one
// line past its limit are each reported; a package within them is not; a test file is not
// counted.
func TestCheckReportsEachLimit(t *testing.T) {
	var big strings.Builder
	big.WriteString("package p\n\ntype big struct {\n")
	for i := range MaxFields + 1 {
		fmt.Fprintf(&big, "\tf%d int\n", i)
	}
	big.WriteString("}\n\ntype many struct{}\n\n")
	for i := range MaxMethods + 1 {
		fmt.Fprintf(&big, "func (m *many) m%d() {}\n", i)
	}
	for big.Len() > 0 && strings.Count(big.String(), "\n") <= MaxFileLines {
		big.WriteString("\n")
	}
	small := "package p\n\ntype ok struct{ a, b int }\n\nfunc (o ok) m() {}\n"
	for _, c := range []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"within", map[string]string{"a.go": small, "a_test.go": big.String()}, nil},
		{"past", map[string]string{"a.go": big.String()}, []string{"big has 16 fields", "many has 31 methods", fmt.Sprintf("a.go has %d lines", MaxFileLines+1)}},
	} {
		dir := t.TempDir()
		for name, text := range c.files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		r := &recorder{TB: t}
		Check(r, dir)
		got := strings.Join(r.errs, "\n")
		if len(c.want) == 0 && got != "" {
			t.Errorf("%s: reported %q; want nothing", c.name, got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: reports %q; want one containing %q", c.name, got, w)
			}
		}
	}
}
