package main

// How quotactl reports errors: exit codes, the text and JSON forms, and the flag (or
// variable, or config key) that set a value a server or quotactl refused.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"google.golang.org/grpc/status"
)

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
// before the flag is parsed, so the command line, QUOTA_OUTPUT and the --config file's
// output key are read here too, in the order that settles a setting (flag, variable, file).
func wantsJSON(cmd *cobra.Command, args []string) bool {
	if f := cmd.Flags().Lookup("output"); f != nil && f.Changed {
		return f.Value.String() == "json"
	}
	config := ""
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case a == "-ojson" || a == "-o=json" || a == "--output=json":
			return true
		case (a == "-o" || a == "--output") && i+1 < len(args):
			return args[i+1] == "json"
		case a == "--config" && i+1 < len(args):
			config = args[i+1]
		case strings.HasPrefix(a, "--config="):
			config = strings.TrimPrefix(a, "--config=")
		}
	}
	if o := os.Getenv("QUOTA_OUTPUT"); o != "" { // viper, too, takes an empty variable as unset
		return o == "json"
	}
	if config == "" {
		config = os.Getenv("QUOTA_CONFIG")
	}
	return config != "" && configOutput(config) == "json"
}

// configOutput is the output key of a config file, or "" if the file cannot be read (that
// error is reported as such once the flags parse).
func configOutput(file string) string {
	v := viper.New()
	v.SetConfigFile(file)
	if v.ReadInConfig() != nil {
		return ""
	}
	return v.GetString("output")
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
	"sale_id": "sale", "sale": "sale", "sku": "sku", "user_id": "user", "request_key": "request-key",
	"quantity": "quantity", "hold_id": "hold", "payment_id": "payment", "units": "units",
	"from": "from", "to": "to", "request_id": "request-key", "per_user_limit": "per-user-limit",
	"hold_ttl": "hold-ttl", "admit_rate": "admit-rate", "ticket_ttl": "ticket-ttl", "max_live_tickets": "max-live-tickets", "room_return_url": "room-return-url", "opens_at": "opens-at", "weights": "allocate", "total": "sku", "skus": "sku",
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
