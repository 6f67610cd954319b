// Package cliconf binds a cobra command's flags, QUOTA_* environment variables and an
// optional --config file into one viper instance: the single place the binaries read their
// configuration from (flags win over the environment, which wins over the file).
package cliconf

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Bind returns the command's settings. QUOTA_PG_URL sets --pg-url; the file named by
// --config (YAML, TOML or JSON) uses the flag names as keys.
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
	}
	return v, nil
}
