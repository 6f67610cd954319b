// Command quotactl is the operator's and auditor's CLI: create and allocate sales, read
// stock, reserve by hand, audit conservation, and drive a simulated flash sale. Every
// command prints JSON with -o json.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
	"github.com/spf13/viper"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// exitError carries a process exit status (1: failure or violation, 2: bad usage).
type exitError struct {
	code int
	err  error
}

// Error is the wrapped error's message.
func (e *exitError) Error() string { return e.err.Error() }

func main() {
	root := rootCmd(os.Stdout)
	if cmd, err := root.ExecuteC(); err != nil {
		code := exitCode(err)
		var ee *exitError
		if !errors.As(err, &ee) || ee.err != nil {
			printError(os.Stderr, cmd, err, code, wantsJSON(cmd, os.Args[1:]))
		}
		os.Exit(code)
	}
}

func rootCmd(out io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "quotactl",
		Short: "Operate and audit the regional quota allocator",
		Long: `quotactl talks to the coordinator (--coordinator, default 127.0.0.1:7400) and, through the
region list the coordinator publishes, to regions named with --region.

Every call is made over mutual TLS with a client certificate from --certs-dir (default
.dev/certs, where quotad dev puts them): the storefront's for reserve, confirm, release, hold
and load, the auditor's for audit, the operator's for the rest; --role picks another.
quotactl cert makes certificates for a real cluster.

Flags can also come from QUOTA_* environment variables (QUOTA_COORDINATOR, QUOTA_CERTS_DIR)
or --config.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{code: 2, err: err} })
	pf := root.PersistentFlags()
	pf.String("coordinator", "127.0.0.1:7400", "coordinator gRPC address")
	pf.StringP("output", "o", "text", "output format: text or json (csv too for audit history and actions list)")
	pf.Duration("timeout", 30*time.Second, "deadline of all of the command's calls together")
	pf.String("config", "", "config file (yaml, toml or json); keys are the flag names")
	addSecurityFlags(root)
	root.AddCommand(saleCmd(), stockCmd(), reserveCmd(), confirmCmd(), releaseCmd(), holdCmd(), holdsCmd(), auditCmd(), regionsCmd(), loadCmd(),
		transferCmd(), transfersCmd(), paymentsCmd(), actionsCmd(), rebalanceCmd(), benchCmd(), certCmd(), ticketKeysCmd(), roomLinkCmd(), consoleCmd(), statusCmd())
	return root
}

// group is a command that only holds subcommands: bare, it shows its help; followed by an
// unknown word, it is a usage error (exit 2), as an unknown command is at the top.
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usage("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return cmd.Help()
		}}
	cmd.AddCommand(subs...)
	return cmd
}

// env is what every command gets: its settings and a connection to the coordinator.
type env struct {
	v     *viper.Viper
	cmd   *cobra.Command
	ctx   context.Context
	conns []*grpc.ClientConn
	tc    credentials.TransportCredentials
}

func newEnv(cmd *cobra.Command) (*env, func(), error) {
	v, err := cliconf.Bind(cmd)
	if err != nil {
		return nil, nil, usage("%v", err)
	}
	if o := v.GetString("output"); o == csvOutput && cmd.Annotations[csvOutput] == "" {
		return nil, nil, usage("--output csv: %s prints text or json only (csv: audit history, actions list)", cmd.CommandPath())
	} else if o != "text" && o != "json" && o != csvOutput {
		return nil, nil, usage("--output %q: must be text or json (or csv, where a command says so)", o)
	}
	timeout := v.GetDuration("timeout")
	if timeout <= 0 {
		return nil, nil, usage("--timeout %s: must be positive", timeout)
	}
	if err := checkRequired(cmd); err != nil {
		return nil, nil, err
	}
	// An empty key typed on purpose (an unset shell variable, often) would quietly become a
	// random one, and a retry a second transfer.
	if f := cmd.Flags().Lookup("request-key"); f != nil && f.Changed && f.Value.String() == "" {
		return nil, nil, usage(`--request-key "": must not be empty (leave the flag out for a new random key)`)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	e := &env{v: v, cmd: cmd, ctx: ctx}
	return e, func() {
		cancel()
		for _, c := range e.conns {
			c.Close()
		}
	}, nil
}

// withEnv makes a cobra RunE of fn: it builds the command's env and releases it after.
func withEnv(fn func(e *env) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		e, done, err := newEnv(cmd)
		if err != nil {
			return err
		}
		defer done()
		return fn(e)
	}
}

func (e *env) dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	creds, err := e.creds()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	e.conns = append(e.conns, conn)
	return conn, nil
}

func (e *env) coordinator() (quotav1.CoordinatorServiceClient, error) {
	addr := e.v.GetString("coordinator")
	if addr == "" {
		return nil, usage("--coordinator: must not be empty (host:port of the coordinator, default 127.0.0.1:7400)")
	}
	conn, err := e.dial(addr, grpc.WithUnaryInterceptor(notACoordinator(addr)))
	if err != nil {
		return nil, err
	}
	return quotav1.NewCoordinatorServiceClient(conn), nil
}

// notACoordinator explains UNIMPLEMENTED from the --coordinator address: the server there
// does not serve the coordinator's API, typically because the address is a region's.
func notACoordinator(addr string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.Unimplemented {
			return fmt.Errorf("%w (--coordinator %s does not serve the coordinator's API: is it a region's address, or an older coordinator?)", err, addr)
		}
		return err
	}
}

// regions asks the coordinator where each region answers.
func (e *env) regions() ([]*quotav1.RegionInfo, error) {
	c, err := e.coordinator()
	if err != nil {
		return nil, err
	}
	resp, err := c.ListRegions(e.ctx, &quotav1.ListRegionsRequest{})
	if err != nil {
		return nil, fmt.Errorf("list regions from coordinator %s: %w", e.v.GetString("coordinator"), err)
	}
	return resp.GetRegions(), nil
}

// onlyRegion is every region, or with a name only that one (a usage error if unknown).
func (e *env) onlyRegion(name string) ([]*quotav1.RegionInfo, error) {
	rs, err := e.regions()
	if err != nil || name == "" {
		return rs, err
	}
	r, err := findRegion(rs, "region", name)
	if err != nil {
		return nil, err
	}
	return []*quotav1.RegionInfo{r}, nil
}

// checkPools refuses a flag (name → value) that names neither a region the coordinator knows
// nor the unallocated pool, listing the regions it knows.
func (e *env) checkPools(flags map[string]string) error {
	rs, err := e.regions()
	if err != nil {
		return err
	}
	for _, flag := range slices.Sorted(maps.Keys(flags)) {
		if name := flags[flag]; name != transfer.Unallocated {
			if _, err := findRegion(rs, flag, name); err != nil {
				return err
			}
		}
	}
	return nil
}

// findRegion is the region named name in rs, or a usage error of flag that lists the known ones.
func findRegion(rs []*quotav1.RegionInfo, flag, name string) (*quotav1.RegionInfo, error) {
	names := make([]string, 0, len(rs))
	for _, r := range rs {
		if r.GetName() == name {
			return r, nil
		}
		names = append(names, r.GetName())
	}
	return nil, usage("--%s %q: unknown region; the coordinator knows %s", flag, name, strings.Join(names, ", "))
}

func (e *env) region(name string) (quotav1.RegionServiceClient, error) {
	if name == "" {
		return nil, usage("--region: name the region (us, eu, ...)")
	}
	rs, err := e.onlyRegion(name)
	if err != nil {
		return nil, err
	}
	conn, err := e.dial(rs[0].GetAddress())
	if err != nil {
		return nil, err
	}
	return quotav1.NewRegionServiceClient(conn), nil
}

func (e *env) json() bool { return e.v.GetString("output") == "json" }

// print writes v as indented JSON with -o json, or text otherwise.
func (e *env) print(v any, text func(w io.Writer)) error {
	w := e.cmd.OutOrStdout()
	if e.json() {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(w)
	return nil
}
