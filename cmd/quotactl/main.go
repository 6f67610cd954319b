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
	"github.com/quotaworks/quota/internal/apierr"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
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

// exitCode is the status quotactl exits with for err (0 for nil): 2 for bad usage, else 1.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case strings.HasPrefix(err.Error(), "unknown command"):
		return 2
	}
	return 1
}

// errorJSON is an error as `-o json` prints it on stderr, for scripts.
type errorJSON struct {
	Error    string `json:"error"`     // the text quotactl prints without -o json
	ExitCode int    `json:"exit_code"` // 1: failure, 2: bad usage
	Code     string `json:"code,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Field    string `json:"field,omitempty"`
	Leader   string `json:"leader,omitempty"` // NOT_LEADER: where the leader answers, when known
}

// wantsJSON tells whether the user asked for -o json. An error in the flags themselves comes
// before the flag is parsed, so the command line and QUOTA_OUTPUT are read here too.
func wantsJSON(cmd *cobra.Command, args []string) bool {
	if f := cmd.Flags().Lookup("output"); f != nil && f.Changed {
		return f.Value.String() == "json"
	}
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case a == "-ojson" || a == "-o=json" || a == "--output=json":
			return true
		case (a == "-o" || a == "--output") && i+1 < len(args):
			return args[i+1] == "json"
		}
	}
	return os.Getenv("QUOTA_OUTPUT") == "json"
}

// printError writes err for a person, or with -o json as one JSON object.
func printError(w io.Writer, cmd *cobra.Command, err error, code int, asJSON bool) {
	text := describeFor(cmd, err)
	if !asJSON {
		fmt.Fprintln(w, "quotactl:", text)
		return
	}
	out := errorJSON{Error: text, ExitCode: code}
	if st, ok := status.FromError(err); ok {
		out.Code, out.Reason, out.Field, out.Leader = st.Code().String(), apierr.Reason(st.Err()), apierr.Field(st.Err()), apierr.LeaderHint(st.Err())
	}
	b, _ := json.Marshal(out)
	fmt.Fprintln(w, string(b))
}

// describe renders an error with its gRPC code, machine-readable reason and field when a
// server sent them.
func describe(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return err.Error()
	}
	st := se.GRPCStatus()
	msg := fmt.Sprintf("%s (%s", err.Error(), st.Code())
	if r := apierr.Reason(st.Err()); r != "" {
		msg += ", reason " + r
	}
	if f := apierr.Field(st.Err()); f != "" {
		msg += ", field " + f
	}
	return msg + ")"
}

// flagOfField names the flag that sets each request field a server may call invalid.
var flagOfField = map[string]string{
	"sale_id": "sale", "sale": "sale", "sku": "sku", "user_id": "user", "request_key": "key",
	"quantity": "quantity", "hold_id": "hold", "payment_id": "payment", "units": "units",
	"from": "from", "to": "to", "request_id": "request-id", "per_user_limit": "per-user-limit",
	"hold_ttl": "hold-ttl", "opens_at": "opens-at", "weights": "allocate", "total": "sku", "skus": "sku",
}

// describeFor is describe, plus the flag of cmd that set the field a server found invalid:
// the server names the protocol's field (sale_id), the user typed a flag (--sale).
func describeFor(cmd *cobra.Command, err error) string {
	msg := describe(err)
	if cmd == nil {
		return msg
	}
	st, ok := status.FromError(err)
	if !ok {
		return msg + usageSource(cmd, msg)
	}
	name, ok := flagOfField[apierr.Field(st.Err())]
	if !ok {
		return msg
	}
	f := cmd.Flags().Lookup(name)
	if f == nil {
		return msg
	}
	return msg + "; set by " + cliconf.Source(f)
}

// usageSource names where the value came from when quotactl itself refused a flag's value
// (its messages start with the flag: "--output \"yaml\": ...") and the value was not typed
// on the command line but came from a QUOTA_* variable or the config file.
func usageSource(cmd *cobra.Command, msg string) string {
	name, ok := strings.CutPrefix(msg, "--")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(name, " :="); i >= 0 {
		name = name[:i]
	}
	f := cmd.Flags().Lookup(name)
	if f == nil {
		return ""
	}
	if src := cliconf.Source(f); src != "--"+name {
		return "; set by " + src
	}
	return ""
}

func rootCmd(out io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "quotactl",
		Short: "Operate and audit the regional quota allocator",
		Long: `quotactl talks to the coordinator (--coordinator, default 127.0.0.1:7400) and, through the
region list the coordinator publishes, to regions named with --region.

Flags can also come from QUOTA_* environment variables (QUOTA_COORDINATOR) or --config.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{code: 2, err: err} })
	pf := root.PersistentFlags()
	pf.String("coordinator", "127.0.0.1:7400", "coordinator gRPC address")
	pf.StringP("output", "o", "text", "output format: text or json")
	pf.Duration("timeout", 30*time.Second, "deadline of all of the command's calls together")
	pf.String("config", "", "config file (yaml, toml or json); keys are the flag names")
	root.AddCommand(saleCmd(), stockCmd(), reserveCmd(), confirmCmd(), releaseCmd(), holdCmd(), auditCmd(), regionsCmd(), loadCmd(),
		transferCmd(), transfersCmd(), rebalanceCmd(), benchCmd())
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
}

func newEnv(cmd *cobra.Command) (*env, func(), error) {
	v, err := cliconf.Bind(cmd)
	if err != nil {
		return nil, nil, usage("%v", err)
	}
	if o := v.GetString("output"); o != "text" && o != "json" {
		return nil, nil, usage("--output %q: must be text or json", o)
	}
	timeout := v.GetDuration("timeout")
	if timeout <= 0 {
		return nil, nil, usage("--timeout %s: must be positive", timeout)
	}
	if err := checkRequired(cmd); err != nil {
		return nil, nil, err
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

// requiredMark in a flag's help makes the flag required: the help a user reads and the check
// are then one and the same. A required flag left empty (or, for a number, 0) on the command
// line, in QUOTA_* and in the config file is a usage error, caught before any call is made.
const requiredMark = "(required)"

func checkRequired(cmd *cobra.Command) error {
	var missing []string
	var zero *pflag.Flag
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(f.Usage, requiredMark) {
			return
		}
		v := f.Value.String()
		number := strings.HasPrefix(f.Value.Type(), "int") || strings.HasPrefix(f.Value.Type(), "float")
		switch {
		case v == "" || v == "[]" || (number && v == "0" && !f.Changed):
			missing = append(missing, "--"+f.Name)
		case number && v == "0" && zero == nil:
			zero = f // given, as 0
		}
	})
	if len(missing) > 0 {
		return usage("%s: required (see %s --help)", strings.Join(missing, ", "), cmd.CommandPath())
	}
	if zero != nil {
		return usage("--%s 0: must be positive", zero.Name)
	}
	return nil
}

func usage(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

func (e *env) dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
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
