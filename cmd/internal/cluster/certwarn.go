package cluster

import (
	"log/slog"
	"path/filepath"
	"time"

	"github.com/quotaworks/quota/internal/trust"
)

// WarnCertificates logs a warning for each certificate of dir with a problem at now: one
// within trust.ExpiresSoon of its end, expired, or not signed by ca.crt. A server calls it
// at start, once its own certificates have loaded, so that what will soon stop every
// handshake is said weeks before it does. A directory List cannot read is logged too; the
// server's own certificates have been checked already, so it starts either way.
func WarnCertificates(dir string, now time.Time, log *slog.Logger) {
	certs, err := trust.List(dir, now)
	if err != nil {
		log.Warn("certificates: cannot list them to check their expiry", "certs_dir", dir, "err", err)
		return
	}
	for _, c := range certs {
		if c.Problem == "" {
			continue
		}
		log.Warn("certificate "+c.Problem, "file", filepath.Join(dir, c.File), "not_after", c.NotAfter.UTC().Format(time.RFC3339),
			"days_left", c.DaysLeft, "renew", "quotactl cert (docs/security.md); quotad dev renews its own at start")
	}
}
