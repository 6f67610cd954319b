package fencing

import (
	"context"
	"errors"
	"fmt"

	"github.com/quotaworks/quota/internal/trust"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Who may touch what in etcd. Authentication is by client certificate: the certificate's CN
// is the etcd user (trust.EtcdUser), and each user has one role of the same purpose. Only
// the processes that need a key may touch it:
//
//	user                  role                  may
//	quota/region/<name>   quota-region-<name>   read+write its own election prefix and the bindings;
//	                                            read the coordinator's election and the stock flags
//	quota/coordinator     quota-coordinator     read+write its election prefix, the stock flags and
//	                                            the bindings (to remove one naming no region); read
//	                                            every region's election
//	root                  root                  everything (users, roles, auth; etcdctl by operators)
//
// Every other certificate of the cluster's CA (a storefront's, an operator's, an auditor's,
// node.crt) names no user and may do nothing. Every user may read the ping key Dial reads.
const (
	regionElectionPrefix = "/quota/election/region/"
	pingKey              = "/quota/ping"
)

// grant is one permission of a role: a key (exact) or, with prefix, every key under it.
type grant struct {
	key    string
	prefix bool
	perm   clientv3.PermissionType
}

var (
	read      = clientv3.PermissionType(clientv3.PermRead)
	readWrite = clientv3.PermissionType(clientv3.PermReadWrite)
)

// regionGrants is what region name's processes may do.
func regionGrants(name string) []grant {
	return []grant{
		{electionKey("region/"+name) + "/", true, readWrite},
		{electionKey("coordinator") + "/", true, read},
		{bindPrefix, true, readWrite},
		{flagPrefix, true, read},
		{pingKey, false, read},
	}
}

// coordinatorGrants is what the coordinator processes may do.
func coordinatorGrants() []grant {
	return []grant{
		{electionKey("coordinator") + "/", true, readWrite},
		{regionElectionPrefix, true, read},
		{flagPrefix, true, readWrite},
		{bindPrefix, true, readWrite},
		{pingKey, false, read},
	}
}

// Users are the etcd users of a cluster of regions: root, the coordinator and each region's.
// A member's client port accepts only their certificates (TLSFiles.ClientCNs).
func Users(regions []string) []string {
	out := []string{trust.EtcdUser(trust.EtcdRoot), trust.EtcdUser(trust.EtcdCoordinator)}
	for _, r := range regions {
		out = append(out, trust.EtcdUser(trust.EtcdRegion(r)))
	}
	return out
}

// ClientCNs are the common names a member's client port accepts at the TLS handshake
// (TLSFiles.ClientCNs): the etcd users' (Users), or, with etcd's JSON gateway on, none (any
// certificate of the CA). etcd's gateway calls its own member over gRPC with the member's TLS
// settings and verification skipped, so the CN check it would carry fails every such call: a
// member with a CN filter cannot serve the gateway. Without the filter, etcd's authentication
// still decides every key: a certificate that names no etcd user may read or write none, but
// may grant a lease under its CN (docs/security.md, the database failover's etcd).
func ClientCNs(regions []string, gateway bool) []string {
	if gateway {
		return nil
	}
	return Users(regions)
}

// roleName is the etcd role of an identity (trust.EtcdRegion, trust.EtcdCoordinator).
func roleName(identity string) string { return "quota-" + identity }

// EnsureAuth sets up etcd's users and roles for the coordinator and regions, and turns
// authentication on. It is idempotent and may run on every start of every member or process
// that holds the root identity: what exists is kept, what is missing is made (a region added
// later gets its user), grants are re-applied. c must be authenticated as root once
// authentication is on (trust.EtcdRoot's certificate); before that, anyone reaching etcd may
// run it, which is why it runs before etcd serves anyone else (quotad dev) or as the
// cluster's first step (quotad etcd --regions).
func EnsureAuth(ctx context.Context, c *Client, regions []string) error {
	a := c.c.Auth
	if err := ensureUser(ctx, a, trust.EtcdRoot, "root"); err != nil {
		return err
	}
	if err := ensureRole(ctx, a, trust.EtcdCoordinator, coordinatorGrants()); err != nil {
		return err
	}
	for _, r := range regions {
		if err := trust.CheckEtcdIdentity(trust.EtcdRegion(r)); err != nil {
			return fmt.Errorf("regions: %w", err)
		}
		if err := ensureRole(ctx, a, trust.EtcdRegion(r), regionGrants(r)); err != nil {
			return err
		}
	}
	if _, err := a.AuthEnable(ctx); err != nil {
		return fmt.Errorf("etcd auth enable: %w", err)
	}
	return nil
}

// ensureRole makes identity's role with exactly grants' permissions added (existing ones are
// kept), and its user holding the role.
func ensureRole(ctx context.Context, a clientv3.Auth, identity string, grants []grant) error {
	role := roleName(identity)
	if _, err := a.RoleAdd(ctx, role); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("etcd role %s: %w", role, err)
	}
	for _, g := range grants {
		end := ""
		if g.prefix {
			end = clientv3.GetPrefixRangeEnd(g.key)
		}
		if _, err := a.RoleGrantPermission(ctx, role, g.key, end, g.perm); err != nil {
			return fmt.Errorf("etcd role %s: grant %s: %w", role, g.key, err)
		}
	}
	return ensureUser(ctx, a, trust.EtcdUser(identity), role)
}

// ensureUser makes a user without a password (it authenticates by its certificate's CN)
// and grants it role.
func ensureUser(ctx context.Context, a clientv3.Auth, user, role string) error {
	_, err := a.UserAddWithOptions(ctx, user, "", &clientv3.UserAddOptions{NoPassword: true})
	if err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		return fmt.Errorf("etcd user %s: %w", user, err)
	}
	if _, err := a.UserGrantRole(ctx, user, role); err != nil {
		return fmt.Errorf("etcd user %s: grant role %s: %w", user, role, err)
	}
	return nil
}
