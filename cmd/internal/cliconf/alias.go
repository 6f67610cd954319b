package cliconf

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// A renamed flag keeps its old name for one release as a deprecated alias: a hidden flag of
// the same type that Bind folds into the new one. The old name works wherever the new one
// does (on the command line, as a QUOTA_* variable, as a config file key) and each use prints
// one warning to stderr naming the new name. docs/cli.md lists the deprecated names.
//
// pflag's MarkDeprecated is not used: pflag writes its notice to the flag set's output, which
// cobra sends to the command's standard output, where it would corrupt -o json.

// aliasKey is the annotation of an alias flag naming the flag it stands for.
const aliasKey = "quota/deprecated-alias-of"

// Alias adds to fs old, a deprecated name of fs's flag name: hidden from the help, of the
// same type. Supported types are those of the binaries' renamed flags: string, bool,
// duration, int, int64 and stringSlice. It panics when name is not in fs or has another type,
// a mistake in the program that its tests catch.
func Alias(fs *pflag.FlagSet, old, name string) {
	f := fs.Lookup(name)
	if f == nil {
		panic(fmt.Sprintf("cliconf.Alias: no flag --%s for --%s", name, old))
	}
	usage := "deprecated: use --" + name
	switch f.Value.Type() {
	case "string":
		fs.String(old, "", usage)
	case "bool":
		fs.Bool(old, false, usage)
	case "duration":
		fs.Duration(old, 0, usage)
	case "int":
		fs.Int(old, 0, usage)
	case "int64":
		fs.Int64(old, 0, usage)
	case "stringSlice":
		fs.StringSlice(old, nil, usage)
	default:
		panic(fmt.Sprintf("cliconf.Alias: --%s: flags of type %s have no alias support", name, f.Value.Type()))
	}
	a := fs.Lookup(old)
	a.Hidden = true
	a.Annotations = map[string][]string{aliasKey: {name}}
}

// AliasOf is the flag name that f is a deprecated alias of, or "".
func AliasOf(f *pflag.Flag) string {
	if n := f.Annotations[aliasKey]; len(n) == 1 {
		return n[0]
	}
	return ""
}

// precedence of a set flag's source: the command line (0) wins over a QUOTA_* variable (1),
// which wins over a config file key (2).
func precedence(f *pflag.Flag) int {
	src := f.Annotations[sourceKey]
	switch {
	case len(src) == 0 || strings.HasPrefix(src[0], "--"): // "--old": folded in from an alias
		return 0
	case strings.HasPrefix(src[0], "QUOTA_"):
		return 1
	}
	return 2
}

// spelled is how the user wrote flag name at f's source: --name, QUOTA_NAME or config key name.
func spelled(f *pflag.Flag, name string) string {
	switch precedence(f) {
	case 0:
		return "--" + name
	case 1:
		return "QUOTA_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	}
	return "config key " + name
}

// resolveAliases folds every deprecated alias that was set into its flag, warning on w once
// per alias used. An alias and its flag set at the same level (both on the command line, say)
// with different values is an error naming both; at different levels, the usual order
// decides (the command line over the environment over the file).
func resolveAliases(w io.Writer, prog string, fs *pflag.FlagSet) error {
	var first error
	fs.VisitAll(func(old *pflag.Flag) {
		name := AliasOf(old)
		if name == "" || !old.Changed || first != nil {
			return
		}
		f := fs.Lookup(name)
		fmt.Fprintf(w, "%s: %s is deprecated and goes in the next release: use %s\n", prog, spelled(old, old.Name), spelled(old, name))
		if f.Changed && precedence(f) <= precedence(old) {
			if precedence(f) == precedence(old) && f.Value.String() != old.Value.String() {
				first = fmt.Errorf("%s %q and %s %q: two values for one setting (%s is the deprecated name of %s): give only %s",
					spelled(old, old.Name), old.Value.String(), spelled(f, name), f.Value.String(), spelled(old, old.Name), spelled(f, name), spelled(f, name))
			}
			return
		}
		if err := copyValue(fs, old, f); err != nil {
			first = fmt.Errorf("%s: %w", spelled(old, old.Name), err)
			return
		}
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[sourceKey] = []string{spelled(old, old.Name)} // Source(f): "--key (--request-key)"
	})
	return first
}

// copyValue sets to from old's value and marks it set.
func copyValue(fs *pflag.FlagSet, old, to *pflag.Flag) error {
	if sv, ok := old.Value.(pflag.SliceValue); ok {
		return setFlag(fs, to, strings.Join(sv.GetSlice(), ","), sv.GetSlice())
	}
	return fs.Set(to.Name, old.Value.String())
}

// bindAliases is resolveAliases for cmd, warning on its stderr.
func bindAliases(cmd *cobra.Command) error {
	return resolveAliases(cmd.ErrOrStderr(), cmd.Root().Name(), cmd.Flags())
}
