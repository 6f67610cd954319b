package cluster

import (
	"context"
	"net/http"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/coordinator/coordhttp"
)

// ConsoleKeysFile is the console key file's name in a certificates or data directory.
const ConsoleKeysFile = "console.keys"

// EnsureConsoleKeys creates the console key file at path with one fresh key when it is
// missing (mode 0600: whoever reads it can log in as an operator), and reports whether it
// did.
func EnsureConsoleKeys(path string) (bool, error) { return ensureKeyFile(path, "console keys") }

// consoleHandler is the coordinator's HTTP listener with the web console: the console
// under coordhttp.Prefix (and / sends there), everything else (GET /metrics) to next. It is
// served under --insecure (no login) or with a console key file; otherwise next alone.
func (n *CoordinatorNode) consoleHandler(next http.Handler) (http.Handler, error) {
	cfg := n.cfg
	if cfg.ConsoleKeys == "" && !cfg.TLS.Insecure() {
		return next, nil
	}
	opts := coordhttp.Options{Insecure: cfg.TLS.Insecure(), Logger: cfg.Logger, Status: n.Status}
	var keys *ticketKeys
	if !opts.Insecure {
		var err error
		if keys, err = loadKeyFile(cfg.ConsoleKeys, "console keys", "quotactl console keys create", cfg.Logger); err != nil {
			return nil, err
		}
		opts.Keys = keys.get
	}
	console, err := coordhttp.New(n.C, opts)
	if err != nil {
		return nil, err
	}
	if keys != nil { // each read of the file ends the sessions of the keys it no longer holds
		keys.changed = func() { console.KeysChanged() }
		n.consoleKeys = keys
	}
	n.console = console
	mux := http.NewServeMux()
	mux.Handle("/", next)
	mux.Handle(coordhttp.Prefix, console)
	mux.Handle("GET /{$}", http.RedirectHandler(coordhttp.Prefix, http.StatusSeeOther))
	return mux, nil
}

// watchConsoleKeys reads the console key file again whenever it changes, until ctx ends,
// so keys rotate under a running coordinator; nothing when it serves no console.
func (n *CoordinatorNode) watchConsoleKeys(ctx context.Context) {
	if n.consoleKeys == nil {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.consoleKeys.watch(ctx)
	}()
}

// Console is the node's web console (nil when it serves none).
func (n *CoordinatorNode) Console() *coordhttp.Console { return n.console }

// ConsoleKeys is the console's keys as last read (nil when it serves no console or serves
// it without login).
func (n *CoordinatorNode) ConsoleKeys() *admission.Keyring {
	if n.consoleKeys == nil {
		return nil
	}
	return n.consoleKeys.get()
}
