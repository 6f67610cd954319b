// Package cliconf binds a cobra command's flags, QUOTA_* environment variables and an
// optional --config file into one viper instance: the single place the binaries read their
// configuration from (flags win over the environment, which wins over the file).
package cliconf

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Bind returns the command's settings. QUOTA_PG_URL sets --pg-url; the file named by
// --config (YAML, TOML or JSON) uses the flag names as keys. A deprecated name (Alias), in
// any of the three places, sets its flag, with a warning on the command's stderr.
func Bind(cmd *cobra.Command) (*viper.Viper, error) {
	v := viper.New()
	v.SetEnvPrefix("QUOTA")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	var bindErr error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err := v.BindPFlag(f.Name, f); err != nil && bindErr == nil {
			bindErr = err
		}
	})
	if bindErr != nil {
		return nil, bindErr
	}
	if file := v.GetString("config"); file != "" {
		v.SetConfigFile(file)
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config %s: %w", file, err)
		}
		if err := checkKeys(cmd, file); err != nil {
			return nil, err
		}
	}
	if err := parseSettings(cmd.Flags(), v); err != nil {
		return nil, err
	}
	if err := bindAliases(cmd); err != nil {
		return nil, err
	}
	return v, nil
}

// checkKeys refuses a config file key that is no flag of quotad or quotactl (programKeys) nor
// of this program, so a misspelled key is an error rather than a setting silently not applied.
// A key of another command's or the other program's flag is allowed: one file may serve both.
// A map under a flag's name is refused as such, not as an unknown "flag.key".
func checkKeys(cmd *cobra.Command, file string) error {
	fv := viper.New()
	fv.SetConfigFile(file)
	if err := fv.ReadInConfig(); err != nil {
		return fmt.Errorf("config %s: %w", file, err)
	}
	known := flagNames(cmd.Root())
	var unknown []string
	for _, k := range fv.AllKeys() {
		if known[k] || programKeys[k] {
			continue
		}
		if top, _, nested := strings.Cut(k, "."); nested && (known[top] || programKeys[top]) {
			return fmt.Errorf("config %s: key %s: want a value or a list, not a map", file, top)
		}
		unknown = append(unknown, k)
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("config %s: unknown key %s: the keys are flag names without the dashes (see --help)",
			file, strings.Join(unknown, ", "))
	}
	return nil
}

// parseSettings gives every flag not set on the command line its QUOTA_* variable's or its
// config file's value, parsed as the flag parses it. viper alone would read "abc" as a zero
// duration and "maybe" as false; parsed here, a bad value is an error that names its source.
// A list flag takes a variable's words (split on spaces, as viper does, and on commas, as the
// flag does) or a file's list, one element each.
func parseSettings(fs *pflag.FlagSet, v *viper.Viper) error {
	var first error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || first != nil {
			return
		}
		source := "QUOTA_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		raw := os.Getenv(source)
		var list []string
		switch {
		case raw != "": // the environment wins over the file; empty counts as unset, as for viper
			// Words, as viper splits them; commas too, as the flag splits them.
			list = SplitList(raw)
		case v.InConfig(f.Name):
			source = "config key " + f.Name
			raw, list = configValue(v.Get(f.Name))
		default:
			return
		}
		if err := setFlag(fs, f, raw, list); err != nil {
			first = fmt.Errorf("%s=%q: not a valid --%s: %v", source, raw, f.Name, err)
			return
		}
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[sourceKey] = []string{source}
	})
	return first
}

// sourceKey is the flag annotation recording where a value not given on the command line
// came from.
const sourceKey = "quota/source"

// Source says where f's value came from, for an error about that value: "--sale" when the
// command line gave it or nothing did (the default), "QUOTA_SALE (--sale)" or "config key
// sale (--sale)" when Bind took it from the environment or the config file.
func Source(f *pflag.Flag) string {
	if src := f.Annotations[sourceKey]; len(src) == 1 {
		return src[0] + " (--" + f.Name + ")"
	}
	return "--" + f.Name
}

// SplitList splits a list value into its elements: on commas, as a list flag splits, and on
// spaces, as viper splits a variable's words. Empty elements are dropped.
func SplitList(s string) []string {
	return strings.FieldsFunc(s, func(c rune) bool { return c == ',' || unicode.IsSpace(c) })
}

// setFlag sets f from raw, or a list flag from list, and marks it set.
func setFlag(fs *pflag.FlagSet, f *pflag.Flag, raw string, list []string) error {
	sv, ok := f.Value.(pflag.SliceValue)
	if !ok {
		return fs.Set(f.Name, raw)
	}
	if err := sv.Replace(list); err != nil {
		return err
	}
	f.Changed = true
	return nil
}

// configValue is a config file's value as a flag's text and as a list's elements. Numbers
// are written out in full (JSON gives 2000000 as a float, which %v would print as 2e+06).
func configValue(x any) (string, []string) {
	str := func(e any) string {
		if f, ok := e.(float64); ok {
			return strconv.FormatFloat(f, 'f', -1, 64)
		}
		return fmt.Sprint(e)
	}
	xs, ok := x.([]any)
	if !ok {
		s := str(x)
		return s, strings.Fields(s)
	}
	list := make([]string, len(xs))
	for i, e := range xs {
		list[i] = str(e)
	}
	return strings.Join(list, ","), list
}

// AddGCFlags adds --gc-percent and --memory-limit, the Go collector's setting of a process
// that runs a region (gcconf).
func AddGCFlags(f *pflag.FlagSet) {
	f.Int("gc-percent", gcconf.DefaultPercent, "Go collector target (GOGC): heap growth in percent before a collection; -1: only at --memory-limit; if not given, a GOGC variable wins")
	f.String("memory-limit", FormatBytes(gcconf.DefaultMemoryLimit), "soft limit of the process's Go memory (GOMEMLIMIT), e.g. 900MiB, 2GiB; 0: none; if not given, a GOMEMLIMIT variable wins")
}

// GC reads the flags AddGCFlags added to cmd, bound by Bind. A setting left at its default yields to Go's
// own GOGC or GOMEMLIMIT environment variable when that is set (a container's memory limit,
// say): the result then carries the value the runtime already runs with.
func GC(cmd *cobra.Command, v *viper.Viper) (gcconf.Config, error) {
	limit, err := ParseBytes(v.GetString("memory-limit"))
	if err != nil {
		return gcconf.Config{}, fmt.Errorf("memory-limit: %w", err)
	}
	c := gcconf.Config{Percent: v.GetInt("gc-percent"), MemoryLimit: limit}
	if err := c.Validate(); err != nil {
		return c, err
	}
	// What Go already runs with is not validated again: the runtime accepted it.
	// Bind marked a setting given by QUOTA_* variable or config file as changed, as a flag.
	if os.Getenv("GOGC") != "" && !cmd.Flags().Changed("gc-percent") {
		c.Percent = gcconf.Current().Percent
	}
	if os.Getenv("GOMEMLIMIT") != "" && !cmd.Flags().Changed("memory-limit") {
		c.MemoryLimit = gcconf.Current().MemoryLimit
	}
	return c, nil
}

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}, {"", 0}}

// ParseBytes reads a size: a whole number of bytes, or one with a KiB, MiB or GiB suffix.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	for _, u := range byteUnits {
		num, ok := strings.CutSuffix(t, u.suffix)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
		if err != nil || n < 0 || n > math.MaxInt64>>u.shift {
			return 0, fmt.Errorf("%q is not a size: want a whole number of bytes, optionally with KiB, MiB or GiB", s)
		}
		return n << u.shift, nil
	}
	return 0, fmt.Errorf("%q is not a size", s) // unreachable: "" matches every string
}

// FormatBytes is the inverse of ParseBytes for the largest unit that divides n.
func FormatBytes(n int64) string {
	for _, u := range byteUnits[:3] {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
