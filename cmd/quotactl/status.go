package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/spf13/cobra"
)

// maxHandshakes bounds the servers quotactl status greets to read their certificates.
const maxHandshakes = 64

func statusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "status",
		Example: `  quotactl status
  quotactl status -o json --cert-warn 720h`,
		Short: "Show the cluster's health; exit 1 when something needs a person",
		Long: `status asks the coordinator for the cluster's state: the coordinators' leader and
generation, every region's leader, epoch and processes (each standby with the age of its warm
copy), etcd's members, each database's role ("single": one server; or, reached through a
multi-host URL, "primary, synchronous standby NAMES" or "primary, no synchronous standby"), unfinished and
stranded transfers and the pauses in force. It adds the certificates: those in --certs-dir and
those the coordinator, every region process and every etcd member present in a TLS handshake,
each flagged when it expires within --cert-warn.

It prints what needs a person last, one line each, and exits 1 when there is any (a region or
the coordinators without a leader or a standby, a process that does not answer, a standby
whose warm copy lags, an etcd member that is not healthy, a stranded transfer, a certificate
about to expire), 0 when there is none.`,
		Args: cobra.NoArgs,
		RunE: withEnv(runStatus),
	}
	cmd.Flags().Duration("cert-warn", trust.ExpiresSoon, "flag certificates that expire within this")
	return cmd
}

// statusOut is what quotactl status prints with -o json.
type statusOut struct {
	OK           bool                 `json:"ok"`
	Coordinator  coordinatorStatusOut `json:"coordinator"`
	Regions      []regionStatusOut    `json:"regions"`
	Etcd         []etcdStatusOut      `json:"etcd"`
	Transfers    transfersStatusOut   `json:"transfers"`
	Paused       []pauseStatusOut     `json:"paused"`
	Certificates []certStatus         `json:"certificates"`
	Problems     []string             `json:"problems"`
}

type regionStatusOut struct {
	Name      string             `json:"name"`
	Leader    string             `json:"leader"`
	Epoch     int64              `json:"epoch"`
	Database  string             `json:"database"`
	Processes []processStatusOut `json:"processes"`
	Error     string             `json:"error,omitempty"`
}

type processStatusOut struct {
	Address  string `json:"address"`
	Answered bool   `json:"answered"`
	Leading  bool   `json:"leading"`
	Epoch    int64  `json:"epoch"`
	// RefreshAgeMs is the age of a standby's warm copy, -1 when it has none.
	RefreshAgeMs     int64  `json:"refresh_age_ms"`
	StandbyRefreshMs int64  `json:"standby_refresh_ms"`
	Error            string `json:"error,omitempty"`
}

type etcdStatusOut struct {
	Name       string `json:"name"`
	Endpoint   string `json:"endpoint"`
	Healthy    bool   `json:"healthy"`
	RaftLeader bool   `json:"raft_leader"`
	Error      string `json:"error,omitempty"`
}

type pauseStatusOut struct {
	Sale   string `json:"sale"`
	SKU    string `json:"sku,omitempty"`
	Reason string `json:"reason"`
}

type coordinatorStatusOut struct {
	Leader     string   `json:"leader"`
	Generation int64    `json:"generation"`
	Candidates []string `json:"candidates"`
	Database   string   `json:"database"`
}

type transfersStatusOut struct {
	Unfinished int64    `json:"unfinished"`
	Stranded   int64    `json:"stranded"`
	Listed     []string `json:"stranded_transfers"`
}

// certStatus is one certificate quotactl checked: a file of --certs-dir, or what a server
// presented.
type certStatus struct {
	Source   string    `json:"source"`
	Subject  string    `json:"subject"`
	NotAfter time.Time `json:"not_after,omitzero"`
	DaysLeft int       `json:"days_left"`
	Problem  string    `json:"problem,omitempty"`
}

func runStatus(e *env) error {
	warn := e.v.GetDuration("cert-warn")
	if warn < 0 {
		return usage("--cert-warn %s: must not be negative", warn)
	}
	c, err := e.coordinator()
	if err != nil {
		return err
	}
	resp, err := c.GetStatus(e.ctx, &quotav1.GetStatusRequest{})
	if err != nil {
		return fmt.Errorf("status from coordinator %s: %w", e.v.GetString("coordinator"), err)
	}
	out := statusFrom(resp)
	out.Certificates = e.checkCerts(resp, warn)
	for _, cs := range out.Certificates {
		if cs.Problem != "" {
			out.Problems = append(out.Problems, fmt.Sprintf("certificate %s (%s): %s", cs.Source, cs.Subject, cs.Problem))
		}
	}
	out.OK = len(out.Problems) == 0
	if out.Problems == nil {
		out.Problems = []string{}
	}
	if err := e.print(out, func(w io.Writer) { printStatus(w, out, warn) }); err != nil {
		return err
	}
	if !out.OK {
		return &exitError{code: 1}
	}
	return nil
}

// statusFrom is the coordinator's answer as quotactl status prints it (certificates aside).
func statusFrom(resp *quotav1.GetStatusResponse) statusOut {
	out := statusOut{Coordinator: coordinatorStatusOut{resp.GetCoordinatorLeader(), resp.GetGeneration(), resp.GetCoordinators(), resp.GetCoordinatorDatabaseRole()},
		Problems: resp.GetProblems(), Regions: []regionStatusOut{}, Etcd: []etcdStatusOut{}, Paused: []pauseStatusOut{},
		Transfers: transfersStatusOut{Unfinished: resp.GetUnfinishedTransfers(), Stranded: resp.GetStrandedCount(), Listed: []string{}}}
	if out.Coordinator.Candidates == nil {
		out.Coordinator.Candidates = []string{}
	}
	for _, r := range resp.GetRegions() {
		ro := regionStatusOut{Name: r.GetName(), Leader: r.GetLeader(), Epoch: r.GetEpoch(), Database: r.GetDatabaseRole(), Error: r.GetError(), Processes: []processStatusOut{}}
		for _, p := range r.GetProcesses() {
			ro.Processes = append(ro.Processes, processStatusOut{Address: p.GetAddress(), Answered: p.GetAnswered(), Leading: p.GetLeading(), Epoch: p.GetEpoch(),
				RefreshAgeMs: p.GetRefreshAgeMs(), StandbyRefreshMs: p.GetStandbyRefreshMs(), Error: p.GetError()})
		}
		out.Regions = append(out.Regions, ro)
	}
	for _, m := range resp.GetEtcd() {
		out.Etcd = append(out.Etcd, etcdStatusOut{m.GetName(), m.GetEndpoint(), m.GetHealthy(), m.GetRaftLeader(), m.GetError()})
	}
	for _, p := range resp.GetPaused() {
		out.Paused = append(out.Paused, pauseStatusOut{p.GetSaleId(), p.GetSku(), p.GetReason()})
	}
	for _, t := range resp.GetStranded() {
		out.Transfers.Listed = append(out.Transfers.Listed, t.GetTransferId())
	}
	return out
}

// checkCerts checks the certificates of --certs-dir and those the servers the status names
// present (the coordinator, every region process, every etcd member), flagging each that
// expires within warn. A server that cannot be reached is left out: the status already says
// so.
func (e *env) checkCerts(resp *quotav1.GetStatusResponse, warn time.Duration) []certStatus {
	now := time.Now()
	out := []certStatus{}
	if e.v.GetBool("insecure") {
		return out
	}
	dir := e.v.GetString("certs-dir")
	if infos, err := trust.List(dir, now); err != nil {
		out = append(out, certStatus{Source: dir, Problem: "unreadable: " + err.Error()})
	} else {
		for _, ci := range infos {
			out = append(out, judgeCert(certStatus{Source: dir + "/" + ci.File, Subject: ci.Name, NotAfter: ci.NotAfter}, now, warn))
		}
	}
	cfg, etcdCfg, err := e.handshakeConfigs()
	if err != nil {
		return append(out, certStatus{Source: dir, Problem: err.Error()})
	}
	servers, members := serverAddrs(e.v.GetString("coordinator"), resp)
	found := presented(e.ctx, cfg, servers)
	if etcdCfg != nil {
		found = append(found, presented(e.ctx, etcdCfg, members)...)
	}
	for _, cs := range found {
		out = append(out, judgeCert(cs, now, warn))
	}
	return out
}

// judgeCert flags cs when it has expired or expires within warn of now.
func judgeCert(cs certStatus, now time.Time, warn time.Duration) certStatus {
	if cs.NotAfter.IsZero() {
		return cs
	}
	left := cs.NotAfter.Sub(now)
	cs.DaysLeft = int(left.Hours() / 24)
	switch {
	case left <= 0:
		cs.Problem = fmt.Sprintf("expired %s", cs.NotAfter.UTC().Format(time.RFC3339))
	case left <= warn:
		cs.Problem = fmt.Sprintf("expires %s, in %d days: renew it (quotactl cert)", cs.NotAfter.UTC().Format(time.RFC3339), cs.DaysLeft)
	}
	return cs
}

// handshakeConfigs are the TLS client configs status greets servers with: the operator's
// certificate (or --role's) for quotad's servers, and for etcd's members the etcd root
// identity's (etcd.root.crt) when --certs-dir has it, else nil: a member refuses, and logs,
// any other client certificate, so its own is not read then.
func (e *env) handshakeConfigs() (*tls.Config, *tls.Config, error) {
	m, err := trust.Load(e.v.GetString("certs-dir"))
	if err != nil {
		return nil, nil, err
	}
	role := trust.Operator
	if r := e.v.GetString("role"); r != "" {
		if role, err = trust.ParseRole(r); err != nil {
			return nil, nil, err
		}
	}
	cfg, err := m.ClientConfig(role)
	if err != nil {
		return nil, nil, err
	}
	etcdCfg, err := m.EtcdClientConfig(trust.EtcdRoot)
	if err != nil {
		etcdCfg = nil // no etcd identity here: etcd's certificates go unread
	}
	return cfg, etcdCfg, nil
}

// serverAddrs are the host:port of every quotad server and of every etcd member the status
// names, once each, at most maxHandshakes in all.
func serverAddrs(coordinator string, resp *quotav1.GetStatusResponse) (servers, members []string) {
	seen := map[string]bool{}
	add := func(to *[]string, a string) {
		if a != "" && !seen[a] && len(seen) < maxHandshakes {
			seen[a] = true
			*to = append(*to, a)
		}
	}
	add(&servers, coordinator)
	for _, c := range resp.GetCoordinators() {
		add(&servers, c)
	}
	for _, r := range resp.GetRegions() {
		for _, p := range r.GetProcesses() {
			add(&servers, p.GetAddress())
		}
	}
	for _, m := range resp.GetEtcd() {
		if u, err := url.Parse(m.GetEndpoint()); err == nil && u.Host != "" {
			add(&members, u.Host)
		}
	}
	return servers, members
}

// presented greets each server at addrs (all at once, each within 3 s) and returns the leaf
// certificate each presented. A certificate the handshake refuses is reported with why.
func presented(ctx context.Context, cfg *tls.Config, addrs []string) []certStatus {
	out := make([]certStatus, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func(cs *certStatus) {
			defer wg.Done()
			*cs = greet(ctx, cfg, a)
		}(&out[i])
	}
	wg.Wait()
	kept := out[:0]
	for _, cs := range out {
		if cs.Source != "" {
			kept = append(kept, cs)
		}
	}
	return kept
}

// greet makes one TLS handshake with addr; a zero certStatus when it cannot be reached.
func greet(ctx context.Context, cfg *tls.Config, addr string) certStatus {
	cfg = cfg.Clone()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		cfg.ServerName = host
	}
	var leaf *x509.Certificate
	cfg.VerifyConnection = func(st tls.ConnectionState) error {
		if len(st.PeerCertificates) > 0 {
			leaf = st.PeerCertificates[0]
		}
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(dctx, "tcp", addr)
	if conn != nil {
		conn.Close()
	}
	var verr *tls.CertificateVerificationError
	switch {
	case leaf != nil:
		return certStatus{Source: addr, Subject: leaf.Subject.CommonName, NotAfter: leaf.NotAfter}
	case err != nil && errors.As(err, &verr) && len(verr.UnverifiedCertificates) > 0:
		c := verr.UnverifiedCertificates[0]
		return certStatus{Source: addr, Subject: c.Subject.CommonName, NotAfter: c.NotAfter, Problem: "refused: " + verr.Err.Error()}
	}
	return certStatus{}
}

// printStatus is quotactl status's text.
func printStatus(w io.Writer, out statusOut, warn time.Duration) {
	co := out.Coordinator
	fmt.Fprintf(w, "coordinator  leader %s (generation %d), %d candidate(s) %s, database %s\n", noneIfEmpty(co.Leader), co.Generation,
		len(co.Candidates), strings.Join(co.Candidates, " "), co.Database)
	for _, r := range out.Regions {
		fmt.Fprintf(w, "region %-5s leader %s (epoch %d), database %s\n", r.Name, noneIfEmpty(r.Leader), r.Epoch, r.Database)
		for _, p := range r.Processes {
			fmt.Fprintf(w, "  %-22s %s\n", p.Address, processLine(p))
		}
	}
	for _, m := range out.Etcd {
		st := "healthy"
		if m.RaftLeader {
			st += ", raft leader"
		}
		if !m.Healthy {
			st = "NOT HEALTHY: " + m.Error
		}
		fmt.Fprintf(w, "etcd %-7s %s %s\n", m.Name, m.Endpoint, st)
	}
	fmt.Fprintf(w, "transfers    %d unfinished, %d stranded\n", out.Transfers.Unfinished, out.Transfers.Stranded)
	for _, p := range out.Paused {
		fmt.Fprintf(w, "paused       %s %s: %s\n", p.Sale, orAll(p.SKU), p.Reason)
	}
	soon := 0
	for _, c := range out.Certificates {
		if c.Problem != "" {
			soon++
		}
	}
	fmt.Fprintf(w, "certificates %d checked, %d expire within %s\n", len(out.Certificates), soon, warn)
	for _, p := range out.Problems {
		fmt.Fprintf(w, "NEEDS A PERSON: %s\n", p)
	}
	if out.OK {
		fmt.Fprintln(w, "ok: nothing needs a person")
	}
}

// processLine describes one region process.
func processLine(p processStatusOut) string {
	switch {
	case !p.Answered:
		return "NOT ANSWERING: " + p.Error
	case p.Leading:
		return fmt.Sprintf("leader, epoch %d", p.Epoch)
	case p.StandbyRefreshMs < 0:
		return "standby (cold: no warm copy)"
	case p.RefreshAgeMs < 0:
		return "standby, warm copy not loaded yet"
	}
	return fmt.Sprintf("standby, warm copy %s old", (time.Duration(p.RefreshAgeMs) * time.Millisecond).String())
}

func noneIfEmpty(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func orAll(sku string) string {
	if sku == "" {
		return "(whole sale)"
	}
	return sku
}
