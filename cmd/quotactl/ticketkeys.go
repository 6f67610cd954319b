package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/cmd/internal/cliconf"
	"github.com/spf13/cobra"
)

// ticketKeysCmd makes and rotates the cluster's ticket key file, with which every region
// signs and checks waiting-room tickets.
func ticketKeysCmd() *cobra.Command {
	create := &cobra.Command{Use: "create", Short: "Create the ticket key file with one fresh key", Args: cobra.NoArgs,
		Example: `  quotactl ticket-keys create --ticket-keys certs/tickets.keys`, RunE: withEnv(runTicketKeysCreate)}
	create.Flags().Bool("overwrite", false, "replace the file if it exists (every ticket issued under the old keys stops working)")
	rotate := &cobra.Command{Use: "rotate", Short: "Put a fresh signing key first and keep the previous one for checking", Args: cobra.NoArgs,
		Example: `  quotactl ticket-keys rotate --ticket-keys certs/tickets.keys`, RunE: withEnv(runTicketKeysRotate)}
	list := &cobra.Command{Use: "list", Short: "List the key ids of the file and which one signs", Args: cobra.NoArgs,
		Example: `  quotactl ticket-keys list --ticket-keys .dev/tickets.keys`, RunE: withEnv(runTicketKeysList)}
	cmd := group("ticket-keys", "Create, rotate and list the keys that sign waiting-room tickets", create, rotate, list)
	cmd.PersistentFlags().String("ticket-keys", ".dev/tickets.keys", "the ticket key file, as quotad region's --ticket-keys (quotad dev's is <data-dir>/tickets.keys)")
	cliconf.Alias(cmd.PersistentFlags(), "file", "ticket-keys")
	cmd.Long = `Regions sign admission tickets (HMAC-SHA256) with the first key of the ticket key file and
accept a ticket signed by any key in it; the file holds at most two. To rotate without
downtime: run rotate, copy the file to every region (they read it again within a few
seconds), and rotate again only after the old tickets have expired (the ticket TTL). The file
is a secret: it is written with mode 0600.`
	return cmd
}

func runTicketKeysCreate(e *env) error {
	return createKeyFile(e, "ticket-keys", "tickets signed with its keys stop working")
}

func runTicketKeysRotate(e *env) error { return rotateKeyFile(e, "ticket-keys") }

// createKeyFile writes a new key file (admission.NewKeyFile) at the path flag names; an
// existing one is replaced only with --overwrite, and the refusal says what replacing it
// ends (lost).
func createKeyFile(e *env, flag, lost string) error {
	path := e.v.GetString(flag)
	if _, err := os.Stat(path); err == nil && !e.v.GetBool("overwrite") {
		return usage("--%s %s exists; pass --overwrite to replace it (%s)", flag, path, lost)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	data, err := admission.NewKeyFile(rand.Reader)
	if err != nil {
		return err
	}
	return writeKeys(e, path, data, "created")
}

// rotateKeyFile rotates the key file at the path flag names (admission.RotateKeyFile).
func rotateKeyFile(e *env, flag string) error {
	path := e.v.GetString(flag)
	old, err := os.ReadFile(path)
	if err != nil {
		return usage("--%s: %v", flag, err)
	}
	data, err := admission.RotateKeyFile(old, rand.Reader)
	if err != nil {
		return fmt.Errorf("--%s %s: %w", flag, path, err)
	}
	return writeKeys(e, path, data, "rotated")
}

// writeKeys replaces path with data at once (a temporary file renamed over it), so a region
// reading it never sees half a file.
func writeKeys(e *env, path string, data []byte, did string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tickets-*.keys")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	if err := errors.Join(werr, tmp.Chmod(0o600), tmp.Close()); err != nil {
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	ring, err := admission.ParseKeyring(data)
	if err != nil {
		return err
	}
	return printKeys(e, path, ring, did)
}

func runTicketKeysList(e *env) error {
	path := e.v.GetString("ticket-keys")
	data, err := os.ReadFile(path)
	if err != nil {
		return usage("--ticket-keys: %v", err)
	}
	ring, err := admission.ParseKeyring(data)
	if err != nil {
		return fmt.Errorf("--ticket-keys %s: %w", path, err)
	}
	return printKeys(e, path, ring, "")
}

func printKeys(e *env, path string, ring *admission.Keyring, did string) error {
	out := struct {
		File    string   `json:"file"`
		Done    string   `json:"done,omitempty"`
		Signing string   `json:"signing_key"`
		Keys    []string `json:"keys"`
	}{path, did, ring.SigningKeyID(), ring.IDs()}
	return e.print(out, func(w io.Writer) {
		if did != "" {
			fmt.Fprintf(w, "%s %s\n", did, path)
		}
		fmt.Fprintf(w, "signing key %s; keys accepted: %v\n", out.Signing, out.Keys)
	})
}
