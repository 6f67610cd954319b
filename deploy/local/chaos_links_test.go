package local_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/quotaworks/quota/internal/testnet"
	"github.com/rs/zerolog"
)

// linkProcs are the processes whose links to PostgreSQL and etcd go through toxiproxy.
var linkProcs = []string{"region-us", "region-eu", "region-ap", "region-us-2", "region-eu-2", "region-ap-2",
	"coordinator1", "coordinator2"}

// links are in-process toxiproxy proxies: per process, one to PostgreSQL (its own database's
// server) and one to each etcd member.
type links struct {
	mu      sync.Mutex
	server  *toxiproxy.ApiServer
	proxies map[string][]*toxiproxy.Proxy // "region-us/pg", "region-us/etcd" → proxies
}

// newLinks starts the proxies for c and adds the settings that make the script use them.
func newLinks(t *testing.T, c *localCluster, pgAddr string) *links {
	t.Helper()
	l := &links{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		proxies: map[string][]*toxiproxy.Proxy{}}
	t.Cleanup(l.stop)
	for _, p := range linkProcs {
		pg, err := l.add(t, p+"/pg", pgAddr)
		if err != nil {
			t.Fatal(err)
		}
		var eps []string
		for i := 1; i <= 3; i++ {
			e, err := l.add(t, p+"/etcd", c.addr(180+i))
			if err != nil {
				t.Fatal(err)
			}
			eps = append(eps, "https://"+e)
		}
		env := strings.ToUpper(strings.ReplaceAll(p, "-", "_"))
		c.env = append(c.env, "QUOTA_CLUSTER_PG_ADDR_"+env+"="+pg, "QUOTA_CLUSTER_ETCD_"+env+"="+strings.Join(eps, ","))
	}
	return l
}

// add starts a proxy to upstream on a free port below the ephemeral range (so that a proxy
// cut and healed can listen on its port again) and returns its address.
func (l *links) add(t *testing.T, name, upstream string) (string, error) {
	t.Helper()
	var err error
	for range 20 {
		p := toxiproxy.NewProxy(l.server, name, testnet.Addr(t), upstream)
		if err = p.Start(); err != nil {
			continue // taken since testnet checked it
		}
		l.proxies[name] = append(l.proxies[name], p)
		return p.Listen, nil
	}
	return "", fmt.Errorf("proxy %s: no free port: %w", name, err)
}

// cut stops the link's proxies: open connections are closed, new ones refused.
func (l *links) cut(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.proxies[name] {
		p.Stop()
	}
}

// blackhole makes the link's proxies drop every byte both ways (toxiproxy's timeout toxic
// with no timeout): connections stay open and silent, as in a partition; a request in flight
// (a COMMIT, a lease renewal) is lost.
func (l *links) blackhole(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.proxies[name] {
		for _, dir := range []string{"upstream", "downstream"} {
			js := fmt.Sprintf(`{"name":"hole_%s","type":"timeout","stream":%q,"attributes":{"timeout":0}}`, dir, dir)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				return fmt.Errorf("blackhole %s: %w", name, err)
			}
		}
	}
	return nil
}

// slow adds latency (both ways) to the link's proxies.
func (l *links) slow(name string, latency time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.proxies[name] {
		for _, dir := range []string{"upstream", "downstream"} {
			js := fmt.Sprintf(`{"name":"slow_%s","type":"latency","stream":%q,"attributes":{"latency":%d,"jitter":%d}}`,
				dir, dir, latency.Milliseconds(), latency.Milliseconds()/4)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				return fmt.Errorf("slow %s: %w", name, err)
			}
		}
	}
	return nil
}

// heal removes every toxic of the link, closes its connections (a blackholed stream has lost
// bytes) and starts its proxies again; it reports a proxy that cannot listen on its port again.
func (l *links) heal(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.proxies[name] {
		p.Toxics.ResetToxics(context.Background())
		p.Stop()
		if err := p.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
			return fmt.Errorf("heal %s (%s): %w", name, p.Listen, err)
		}
	}
	return nil
}

func (l *links) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ps := range l.proxies {
		for _, p := range ps {
			p.Stop()
		}
	}
}
