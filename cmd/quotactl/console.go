package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/quotaworks/quota/coordinator/coordhttp"
	"github.com/quotaworks/quota/internal/trust"
	"github.com/spf13/cobra"
)

// consoleCmd makes login tokens for the coordinator's web console and manages its key file.
func consoleCmd() *cobra.Command {
	token := &cobra.Command{Use: "token", Short: "Make a login token for the web console", Args: cobra.NoArgs,
		Example: `  quotactl console token --role operator --ttl 12h
  quotactl console token --role auditor --name alice --console-keys certs/console.keys`,
		RunE: withEnv(runConsoleToken)}
	f := token.Flags()
	f.String("role", "", "operator (sees everything, resolves transfers, applies the plan) or auditor (sees everything, changes nothing); required")
	f.String("name", "", "who the token is for, shown in the coordinator's log (default the role)")
	f.Duration("ttl", 12*time.Hour, fmt.Sprintf("how long the token may log in (at most %s); a session ends with its token, or after %s", coordhttp.MaxTokenTTL, coordhttp.SessionTTL))
	create := &cobra.Command{Use: "create", Short: "Create the console key file with one fresh key", Args: cobra.NoArgs,
		Example: `  quotactl console keys create --console-keys certs/console.keys`, RunE: withEnv(runConsoleKeysCreate)}
	create.Flags().Bool("overwrite", false, "replace the file if it exists (every token signed with its keys stops logging in)")
	rotate := &cobra.Command{Use: "rotate", Short: "Put a fresh signing key first and keep the previous one for checking", Args: cobra.NoArgs,
		Example: `  quotactl console keys rotate --console-keys certs/console.keys`, RunE: withEnv(runConsoleKeysRotate)}
	keys := group("keys", "Create and rotate the console's key file", create, rotate)
	cmd := group("console", "Log in to the coordinator's web console: tokens and the console key file", token, keys)
	cmd.PersistentFlags().String("console-keys", ".dev/console.keys", "the console key file, as quotad coordinator's --console-keys (quotad dev's is <data-dir>/console.keys)")
	cliconf.Alias(cmd.PersistentFlags(), "keys", "console-keys")
	cmd.Long = `The coordinator serves a web console on its HTTP listener (quotad dev: https://127.0.0.1:8400/console/).
A browser has no client certificate, so it logs in with a token that this command signs with
the console key file, which the coordinator reads too (it reads the file again when it
changes, so a rotation needs no restart). Paste the token into the login form. The file is a
secret (mode 0600): whoever reads it can log in as an operator. docs/console.md says more.`
	return cmd
}

func runConsoleToken(e *env) error {
	role := trust.Role(e.v.GetString("role"))
	name := e.v.GetString("name")
	if name == "" {
		name = string(role)
	}
	ttl := e.v.GetDuration("ttl")
	if ttl <= 0 || ttl > coordhttp.MaxTokenTTL {
		return usage("--ttl %s: must be positive and at most %s", ttl, coordhttp.MaxTokenTTL)
	}
	path := e.v.GetString("console-keys")
	data, err := os.ReadFile(path)
	if err != nil {
		return usage("--console-keys: %v (quotad dev makes <data-dir>/console.keys; elsewhere run quotactl console keys create)", err)
	}
	ring, err := admission.ParseKeyring(data)
	if err != nil {
		return fmt.Errorf("--console-keys %s: %w", path, err)
	}
	expires := time.Now().Add(ttl).Truncate(time.Second)
	tok, err := coordhttp.SignToken(ring, role, name, expires)
	if err != nil {
		return usage("%v", err)
	}
	out := struct {
		Token   string    `json:"token"`
		Role    string    `json:"role"`
		Name    string    `json:"name"`
		Expires time.Time `json:"expires"`
	}{tok, string(role), name, expires.UTC()}
	return e.print(out, func(w io.Writer) {
		fmt.Fprintln(w, tok)
		fmt.Fprintf(e.cmd.ErrOrStderr(), "console login token for %s (%s), valid until %s\n", name, role, out.Expires.Format(time.RFC3339))
	})
}

func runConsoleKeysCreate(e *env) error {
	return createKeyFile(e, "console-keys", "tokens signed with its keys stop logging in")
}

func runConsoleKeysRotate(e *env) error { return rotateKeyFile(e, "console-keys") }
