// Command quotad runs the quota allocator's servers: `quotad dev` (everything in one
// process, for development and demos), `quotad coordinator` and `quotad region`.
//
// Configuration comes from flags, then QUOTA_* environment variables (QUOTA_PG_URL for
// --pg-url), then the file named by --config (YAML, TOML or JSON, keys as the flag names).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/internal/gcconf"
	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "quotad:", err)
		os.Exit(exitCode(err))
	}
}

// usageError is a bad command, flag, QUOTA_* variable or config value: quotad exits 2 for
// it (as quotactl does), and 1 when it fails while running.
type usageError struct{ err error }

// Error is the wrapped error's message.
func (u usageError) Error() string { return u.err.Error() }

// Unwrap returns the wrapped error.
func (u usageError) Unwrap() error { return u.err }

// badUsage marks err (if any) as a usage error.
func badUsage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// exitCode is the status quotad exits with for err: 2 for bad usage, else 1.
func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command") {
		return 2
	}
	return 1
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "quotad",
		Short:         "Regional quota allocator for flash-sale inventory: coordinator and region servers",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return badUsage(err) })
	root.PersistentFlags().String("config", "", "config file (yaml, toml or json); keys are the flag names")
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	cliconf.AddGCFlags(root.PersistentFlags())
	root.AddCommand(devCmd(), coordinatorCmd(), regionCmd(), edgeCmd(), etcdCmd(), wanproxyCmd())
	return root
}

// settings binds a command's flags, QUOTA_* environment variables and the --config file,
// builds the logger its --log-level asks for and sets the Go collector (--gc-percent,
// --memory-limit) for the process.
func settings(cmd *cobra.Command) (*viper.Viper, *slog.Logger, error) {
	v, err := cliconf.Bind(cmd)
	if err != nil {
		return nil, nil, err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(v.GetString("log-level"))); err != nil {
		return nil, nil, fmt.Errorf("log-level %q: %w", v.GetString("log-level"), err)
	}
	gc, err := cliconf.GC(cmd, v)
	if err != nil {
		return nil, nil, err
	}
	gcconf.Apply(gc)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	log.Debug("go collector", "setting", gc.String())
	return v, log, nil
}

// signalContext ends on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
