package trust

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"

	"github.com/quotaworks/quota/internal/apierr"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Methods is the one table of who may call what: every RPC of every service, by gRPC full
// method name, and the roles allowed to call it. A method missing from the table is refused
// to every role. docs/security.md prints it as the role matrix; TestTableCoversEveryRPC
// (internal/rpcserve) keeps it complete and TestMatrix pins it.
var Methods = map[string][]Role{
	// RegionService: storefronts reserve; the reads are open to operators and auditors too.
	"/quota.v1.RegionService/Reserve":        {Storefront},
	"/quota.v1.RegionService/Confirm":        {Storefront},
	"/quota.v1.RegionService/Release":        {Storefront},
	"/quota.v1.RegionService/GetReservation": {Storefront, Operator, Auditor},
	"/quota.v1.RegionService/GetStock":       {Storefront, Operator, Auditor},
	"/quota.v1.RegionService/DescribeSale":   {Storefront, Operator, Auditor},
	"/quota.v1.RegionService/Enter":          {Storefront},
	"/quota.v1.RegionService/GetAdmission":   {Storefront},
	"/quota.v1.RegionService/JoinWaitlist":   {Storefront},
	"/quota.v1.RegionService/ListBuyerHolds": {Storefront, Operator, Auditor},
	// LineChanges feeds a storefront edge (quotad edge, which calls with the storefront's
	// certificate) the waiting lines it answers polls from.
	"/quota.v1.RegionService/LineChanges": {Storefront},

	// ParticipantService: the sale's terms and pauses and the transfer steps, for the
	// coordinator alone.
	"/quota.v1.ParticipantService/PutSale":        {Coordinator},
	"/quota.v1.ParticipantService/Credit":         {Coordinator},
	"/quota.v1.ParticipantService/Debit":          {Coordinator},
	"/quota.v1.ParticipantService/RefuseDebit":    {Coordinator},
	"/quota.v1.ParticipantService/Refuse":         {Coordinator},
	"/quota.v1.ParticipantService/Restore":        {Coordinator},
	"/quota.v1.ParticipantService/Settle":         {Coordinator},
	"/quota.v1.ParticipantService/TransferStatus": {Coordinator},
	"/quota.v1.ParticipantService/SetPaused":      {Coordinator},
	"/quota.v1.ParticipantService/NodeStatus":     {Coordinator},

	// CoordinatorService: operators change; auditors read. ListRegions is also how a
	// storefront finds its region's address.
	"/quota.v1.CoordinatorService/CreateSale":       {Operator},
	"/quota.v1.CoordinatorService/Allocate":         {Operator},
	"/quota.v1.CoordinatorService/Transfer":         {Operator},
	"/quota.v1.CoordinatorService/ResolveTransfer":  {Operator},
	"/quota.v1.CoordinatorService/Rebalance":        {Operator},
	"/quota.v1.CoordinatorService/PlanRebalance":    {Operator, Auditor},
	"/quota.v1.CoordinatorService/PauseSale":        {Operator},
	"/quota.v1.CoordinatorService/ResumeSale":       {Operator},
	"/quota.v1.CoordinatorService/GetSale":          {Operator, Auditor},
	"/quota.v1.CoordinatorService/Audit":            {Operator, Auditor},
	"/quota.v1.CoordinatorService/AuditHistory":     {Operator, Auditor},
	"/quota.v1.CoordinatorService/AuditLimits":      {Operator, Auditor},
	"/quota.v1.CoordinatorService/ListLatePayments": {Operator, Auditor},
	"/quota.v1.CoordinatorService/ListActions":      {Operator, Auditor},
	"/quota.v1.CoordinatorService/GetTransfer":      {Operator, Auditor},
	"/quota.v1.CoordinatorService/ListTransfers":    {Operator, Auditor},
	"/quota.v1.CoordinatorService/ListRegions":      {Operator, Auditor, Storefront},
	"/quota.v1.CoordinatorService/GetStatus":        {Operator, Auditor},
}

// openMethod is the one call anyone may make, with or without a certificate: a health check,
// for load balancers and orchestrators. Health's Watch stream needs a certificate: an open
// stream per call would let anyone hold memory and connections for as long as they like.
const openMethod = "/grpc.health.v1.Health/Check"

// anyRoleServices may be called by any client with a valid certificate, whatever its role:
// server reflection (grpcurl's describe and list) and health's Watch.
var anyRoleServices = []string{"/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/", "/grpc.health.v1.Health/"}

// Allowed reports whether role may call method, by the table.
func Allowed(role Role, method string) bool {
	if method == openMethod {
		return true
	}
	if role == "" {
		return false
	}
	if slices.ContainsFunc(anyRoleServices, func(s string) bool { return strings.HasPrefix(method, s) }) {
		return true
	}
	return slices.Contains(Methods[method], role)
}

// Caller is who a call comes from: the role and name of its verified client certificate.
// Certified is false when the connection presented none (or is plaintext).
type Caller struct {
	Role      Role
	Name      string
	Certified bool
}

// CallerOf reads the caller of a gRPC call from its connection's verified certificate.
func CallerOf(ctx context.Context) Caller {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Caller{}
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Caller{}
	}
	return CallerOfState(&info.State)
}

// CallerOfState reads the caller from a TLS connection's verified certificate (an HTTP
// request's r.TLS); nil is a plaintext connection.
func CallerOfState(state *tls.ConnectionState) Caller {
	if state == nil || len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return Caller{}
	}
	leaf := state.VerifiedChains[0][0]
	return Caller{Role: RoleOf(leaf), Name: leaf.Subject.CommonName, Certified: true}
}

// Authorize decides one call on a secure server: health checks pass; a call without a
// verified client certificate is Unauthenticated; a role the table does not allow is
// PermissionDenied, naming the role and the method.
func Authorize(ctx context.Context, method string) error {
	return AuthorizeCaller(CallerOf(ctx), method)
}

// AuthorizeCaller is Authorize for a caller already read (the HTTP edge reads it from the
// request's TLS state): the same table decides both APIs.
func AuthorizeCaller(c Caller, method string) error {
	if method == openMethod {
		return nil
	}
	return decide(c, method, Allowed(c.Role, method))
}

// MetricsRoles may read a process's Prometheus metrics (GET /metrics on a region's HTTP edge
// and on the coordinator's HTTP listener): operators, and auditors, who read everything and
// change nothing. Prometheus scrapes with such a certificate (tls_config cert_file and
// key_file). docs/security.md prints it under the role matrix; TestMetricsRoles pins it.
var MetricsRoles = []Role{Operator, Auditor}

// MetricsPath is where every quotad process serves its metrics.
const MetricsPath = "/metrics"

// AuthorizeMetrics decides one scrape of MetricsPath on a secure server, as AuthorizeCaller
// decides a call: without a verified client certificate it is Unauthenticated; a role not in
// MetricsRoles is PermissionDenied, naming the role.
func AuthorizeMetrics(c Caller) error {
	return decide(c, "GET "+MetricsPath, c.Role != "" && slices.Contains(MetricsRoles, c.Role))
}

// decide is the answer to c's call of what, which the rules allowed or not.
func decide(c Caller, what string, allowed bool) error {
	if !c.Certified {
		return fmt.Errorf("%s needs a client certificate signed by the cluster's CA (see quotactl cert): %w", what, apierr.ErrUnauthenticated)
	}
	if !allowed {
		role := string(c.Role)
		if role == "" {
			role = "none"
		}
		return fmt.Errorf("role %s (certificate %q) may not call %s: %w", role, c.Name, what, apierr.ErrPermissionDenied)
	}
	return nil
}
