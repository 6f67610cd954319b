package main

import (
	"github.com/quotaworks/quota/internal/trust"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"
)

// defaultCertsDir is where `quotad dev` puts its certificates with its default data dir.
const defaultCertsDir = ".dev/certs"

// commandRoles is the role whose client certificate each command presents unless --role
// names another: the storefront's calls for the storefront commands, the auditor's for the
// audit, the operator's for everything else (changes, and the reads the operator may make).
var commandRoles = map[string]trust.Role{
	"quotactl reserve": trust.Storefront,
	"quotactl confirm": trust.Storefront,
	"quotactl release": trust.Storefront,
	"quotactl hold":    trust.Storefront,
	"quotactl load":    trust.Storefront,
	"quotactl audit":   trust.Auditor,
}

// roleOf is the role a command's calls are made as.
func roleOf(cmd *cobra.Command) trust.Role {
	if r, ok := commandRoles[cmd.CommandPath()]; ok {
		return r
	}
	return trust.Operator
}

func addSecurityFlags(cmd *cobra.Command) {
	pf := cmd.PersistentFlags()
	pf.String("certs-dir", defaultCertsDir, "directory of ca.crt and the client.<role>.crt/.key certificates (quotad dev's are in .dev/certs)")
	pf.String("role", "", "the role whose certificate to present: coordinator, storefront, operator or auditor (default: what the command needs)")
	pf.Bool("insecure", false, "connect in plaintext, without certificates (only to servers run with --insecure)")
}

// creds are the transport credentials of the command's connections, built once.
func (e *env) creds() (credentials.TransportCredentials, error) {
	if e.tc != nil {
		return e.tc, nil
	}
	var m *trust.Material
	if !e.v.GetBool("insecure") {
		var err error
		if m, err = trust.Load(e.v.GetString("certs-dir")); err != nil {
			return nil, usage("--certs-dir: %v (or --insecure for a plaintext cluster)", err)
		}
	}
	role := roleOf(e.cmd)
	if r := e.v.GetString("role"); r != "" {
		var err error
		if role, err = trust.ParseRole(r); err != nil {
			return nil, usage("--%v", err)
		}
	}
	c, err := m.ClientCreds(role)
	if err != nil {
		return nil, usage("--certs-dir: %v", err)
	}
	e.tc = c
	return c, nil
}
