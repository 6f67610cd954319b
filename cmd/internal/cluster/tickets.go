package cluster

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/quotaworks/quota/admission"
)

// TicketKeysFile is the ticket key file's name in a certificates or data directory.
const TicketKeysFile = "tickets.keys"

// EnsureTicketKeys creates the ticket key file at path with one fresh key when it is
// missing (mode 0600: it is a secret), and reports whether it did.
func EnsureTicketKeys(path string) (bool, error) { return ensureKeyFile(path, "ticket keys") }

// ensureKeyFile creates a key file (admission.NewKeyFile) at path when it is missing, mode
// 0600, and reports whether it did; what names the file in errors.
func ensureKeyFile(path, what string) (bool, error) {
	if _, err := os.Stat(path); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	data, err := admission.NewKeyFile(rand.Reader)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	if _, err := f.Write(data); err != nil {
		return false, errors.Join(fmt.Errorf("%s %s: %w", what, path, err), f.Close())
	}
	return true, f.Close()
}

// ticketKeys is a key file as last read: the cluster's ticket keys, or the console's keys
// (what names which, hint how to make the file). watch reads it again when it changes, so
// keys rotate under a running process (the file's two keys both verify); a file that no
// longer parses is reported and the keys read before stay in use.
type ticketKeys struct {
	path  string
	what  string
	hint  string
	keys  atomic.Pointer[admission.Keyring]
	stamp fileStamp
	log   *slog.Logger
	// changed, when set, is called after each read of a changed file (the console's ends
	// the sessions of the keys the file no longer holds). Set before watch starts.
	changed func()
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func loadTicketKeys(path string, log *slog.Logger) (*ticketKeys, error) {
	return loadKeyFile(path, "ticket keys", "quotactl ticket-keys create", log)
}

func loadKeyFile(path, what, hint string, log *slog.Logger) (*ticketKeys, error) {
	k := &ticketKeys{path: path, what: what, hint: hint, log: log}
	if err := k.read(); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *ticketKeys) read() error {
	st, err := os.Stat(k.path)
	if err != nil {
		return fmt.Errorf("%s: %w (make the file with %s)", k.what, err, k.hint)
	}
	data, err := os.ReadFile(k.path)
	if err != nil {
		return fmt.Errorf("%s: %w", k.what, err)
	}
	ring, err := admission.ParseKeyring(data)
	if err != nil {
		return fmt.Errorf("%s %s: %w", k.what, k.path, err)
	}
	k.keys.Store(ring)
	k.stamp = fileStamp{st.ModTime(), st.Size()}
	return nil
}

// get returns the keys as last read.
func (k *ticketKeys) get() *admission.Keyring { return k.keys.Load() }

// ticketKeysPoll is how often the key file is looked at for a change.
const ticketKeysPoll = 2 * time.Second

// watch reads the key file again whenever it changes, until ctx ends.
func (k *ticketKeys) watch(ctx context.Context) {
	for sleep(ctx, ticketKeysPoll) == nil {
		st, err := os.Stat(k.path)
		if err != nil {
			k.log.Error(k.what+": the file is gone; the keys read before stay in use", "path", k.path, "err", err)
			continue
		}
		if (fileStamp{st.ModTime(), st.Size()}) == k.stamp {
			continue
		}
		if err := k.read(); err != nil {
			k.log.Error(k.what+": the changed file is refused; the keys read before stay in use", "err", err)
			continue
		}
		k.log.Info(k.what+" read again", "path", k.path, "keys", k.get().String())
		if k.changed != nil {
			k.changed()
		}
	}
}
