package main

import (
	"fmt"
	"io"
	"time"

	"github.com/quotaworks/quota/internal/trust"
	"github.com/spf13/cobra"
)

// certCmd makes and lists the certificates of a cluster, the way CockroachDB's cert commands
// do: one CA, a node certificate for the servers, a client certificate per role.
func certCmd() *cobra.Command {
	createCA := &cobra.Command{Use: "create-ca", Short: "Create the cluster's certificate authority (ca.crt, ca.key)", Args: cobra.NoArgs,
		Example: `  quotactl cert create-ca --certs-dir certs`,
		RunE: withEnv(func(e *env) error {
			return certDone(e, trust.CreateCA(e.v.GetString("certs-dir"), e.v.GetBool("overwrite")), trust.CACert, trust.CAKey)
		})}
	createNode := &cobra.Command{Use: "create-node", Short: "Create node.crt/node.key for the servers, signed by ca.key", Args: cobra.NoArgs,
		Example: `  quotactl cert create-node --host localhost --host 127.0.0.1 --certs-dir certs`,
		RunE: withEnv(func(e *env) error {
			return certDone(e, trust.CreateNode(e.v.GetString("certs-dir"), e.v.GetStringSlice("host"), e.v.GetBool("overwrite")),
				trust.NodeCert, trust.NodeKey)
		})}
	createNode.Flags().StringSlice("host", nil, "a host name or IP address the servers answer on, repeated for each (required)")
	createClient := &cobra.Command{Use: "create-client", Short: "Create client.<role>.crt/.key for a role, signed by ca.key", Args: cobra.NoArgs,
		Example: `  quotactl cert create-client --role operator --certs-dir certs
  quotactl cert create-client --role storefront --name shop-eu --certs-dir certs`,
		RunE: withEnv(runCreateClient)}
	createClient.Flags().String("name", "", "the certificate's common name, shown in logs and refusals (default: the role); a name other than the role's is part of the file name")
	createEtcd := &cobra.Command{Use: "create-etcd", Short: "Create etcd.<identity>.crt/.key: a process's etcd user, signed by ca.key", Args: cobra.NoArgs,
		Long: `create-etcd makes the certificates etcd authenticates its clients by: the certificate's
common name is the etcd user, and etcd lets each user touch only its own keys. root is etcd's
administrator (quotad etcd sets up the users and roles with it; operators' etcdctl);
coordinator is every coordinator process; region-<name> every process of region <name>.`,
		Example: `  quotactl cert create-etcd --identity root --identity coordinator --identity region-us --certs-dir certs`,
		RunE:    withEnv(runCreateEtcd)}
	createEtcd.Flags().StringSlice("identity", nil, "root, coordinator or region-<name>, repeated for each (required)")
	list := &cobra.Command{Use: "list", Short: "List the certificates of --certs-dir with their roles, hosts, expiry and problems", Args: cobra.NoArgs,
		Example: `  quotactl cert list --certs-dir .dev/certs`, RunE: withEnv(runCertList)}
	for _, c := range []*cobra.Command{createCA, createNode, createClient, createEtcd} {
		c.Flags().Bool("overwrite", false, "replace files that exist (replacing the CA invalidates every certificate it signed)")
	}
	cmd := group("cert", "Create and list the cluster's TLS certificates", createCA, createNode, createClient, createEtcd, list)
	cmd.Long = `A cluster trusts one certificate authority (ca.crt). Every server presents node.crt; every
client presents client.<role>.crt, whose role (coordinator, storefront, operator, auditor)
decides what it may call. Each process that talks to etcd has etcd.<identity>.crt, its etcd
user. Keep ca.key where certificates are made, not on the servers.`
	return cmd
}

func runCreateClient(e *env) error {
	role, err := trust.ParseRole(e.v.GetString("role"))
	if err != nil {
		return usage("--%v", err)
	}
	name := e.v.GetString("name")
	err = trust.CreateClient(e.v.GetString("certs-dir"), role, name, e.v.GetBool("overwrite"))
	return certDone(e, err, trust.ClientCert(role, name), trust.ClientKey(role, name))
}

func runCreateEtcd(e *env) error {
	ids := e.v.GetStringSlice("identity")
	if len(ids) == 0 {
		return usage("--identity: name at least one: root, coordinator or region-<name>")
	}
	var files []string
	for _, id := range ids {
		if err := trust.CheckEtcdIdentity(id); err != nil {
			return usage("--%v", err)
		}
		if err := trust.CreateEtcd(e.v.GetString("certs-dir"), id, e.v.GetBool("overwrite")); err != nil {
			return certDone(e, err, files...)
		}
		files = append(files, trust.EtcdCert(id), trust.EtcdKey(id))
	}
	return certDone(e, nil, files...)
}

func certDone(e *env, err error, files ...string) error {
	if err != nil {
		return err
	}
	out := struct {
		Dir     string   `json:"certs_dir"`
		Created []string `json:"created"`
	}{e.v.GetString("certs-dir"), files}
	return e.print(out, func(w io.Writer) {
		for _, f := range files {
			fmt.Fprintf(w, "created %s/%s\n", out.Dir, f)
		}
	})
}

func runCertList(e *env) (err error) {
	certs, err := trust.List(e.v.GetString("certs-dir"), time.Now())
	if err != nil {
		return err
	}
	out := struct {
		Certs []trust.CertInfo `json:"certificates"`
	}{certs}
	refused := 0
	for _, c := range certs {
		if c.Refused() {
			refused++
		}
	}
	if refused > 0 {
		defer func() { // after the listing: exit 1, as audit does on a violation
			if err == nil {
				err = &exitError{code: 1, err: fmt.Errorf("%d certificate(s) would be refused", refused)}
			}
		}()
	}
	return e.print(out, func(w io.Writer) {
		for _, c := range certs {
			role := string(c.Role)
			if role == "" {
				role = "-"
			}
			fmt.Fprintf(w, "%-28s %-6s role %-11s name %-14s expires %s (%s)", c.File, c.Kind, role, c.Name,
				c.NotAfter.Format("2006-01-02"), daysLeftText(c.DaysLeft))
			if len(c.Hosts) > 0 {
				fmt.Fprintf(w, "  hosts %v", c.Hosts)
			}
			if c.Problem != "" {
				fmt.Fprintf(w, "  PROBLEM: %s", c.Problem)
			}
			fmt.Fprintln(w)
		}
	})
}

// daysLeftText says how long a certificate has left: "1825 days left", or "expired" once
// past.
func daysLeftText(days int) string {
	switch {
	case days < 0:
		return "expired"
	case days == 1:
		return "1 day left"
	default:
		return fmt.Sprintf("%d days left", days)
	}
}
