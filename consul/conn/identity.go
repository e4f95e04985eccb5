package conn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// ErrNotOneCluster is matched by Start's error when the --consul-address
// addresses belong to more than one Consul datacenter or cluster: no retry
// mends that.
var ErrNotOneCluster = errors.New("the Consul addresses are not one datacenter of one Consul cluster")

// ErrUnknownDatacenter is matched by Start's error when the configured
// datacenter is none the addresses know: no retry mends that.
var ErrUnknownDatacenter = errors.New("the Consul addresses know no such datacenter")

// Identity is what a Consul agent (server or client) says of where it
// belongs, read without a token from endpoints every ACL policy allows:
//
//   - Datacenter: its own datacenter. /v1/catalog/datacenters lists every
//     datacenter it knows (one, unless WAN-federated); with several, its
//     own is the one whose leader (/v1/status/leader?dc=) is its leader.
//     (/v1/agent/self names it directly but needs agent:read, which
//     fleetsync's policy does not grant.)
//   - Servers: the Raft peers (/v1/status/peers), the server RPC
//     addresses of its datacenter. Two agents of one cluster answer the
//     same set (or, while a server joins or leaves, overlapping sets); two
//     separate clusters, even of the same datacenter name, share no server.
//   - TrustDomain: the Connect CA's trust domain (/v1/connect/ca/roots),
//     "<cluster id>.consul", random per cluster and shared by its
//     federated datacenters; "" when Connect is off.
type Identity struct {
	Datacenter  string
	Servers     []string
	TrustDomain string
	// Datacenters are all those the agent knows (its own, and a WAN
	// federation's others), as /v1/catalog/datacenters lists them.
	Datacenters []string
}

func (id Identity) String() string {
	s := fmt.Sprintf("datacenter %q, Raft servers %s", id.Datacenter, strings.Join(id.Servers, ","))
	if id.TrustDomain != "" {
		s += ", trust domain " + id.TrustDomain
	}
	return s
}

// sameAs reports whether id and ref are one datacenter of one cluster,
// and if not, why.
func (id Identity) sameAs(ref Identity) (bool, string) {
	switch {
	case id.Datacenter != ref.Datacenter:
		return false, fmt.Sprintf("datacenter %q, not %q", id.Datacenter, ref.Datacenter)
	case !slices.ContainsFunc(id.Servers, func(s string) bool { return slices.Contains(ref.Servers, s) }):
		return false, fmt.Sprintf("Raft servers %s, none of %s: another Consul cluster", strings.Join(id.Servers, ","), strings.Join(ref.Servers, ","))
	case id.TrustDomain != "" && ref.TrustDomain != "" && id.TrustDomain != ref.TrustDomain:
		return false, fmt.Sprintf("trust domain %s, not %s: another Consul cluster", id.TrustDomain, ref.TrustDomain)
	}
	return true, ""
}

// maxIdentityAnswer bounds each answer read for an Identity (a CA roots
// answer is a few KiB per root).
const maxIdentityAnswer = 1 << 20

// identityTimeout bounds the reads of one address's Identity.
const identityTimeout = 5 * time.Second

// prober reads from one address at a time, without a token and around
// the failover: the base transport of the connection (its TLS).
type prober struct {
	rt     http.RoundTripper
	scheme string
}

// identity reads addr's Identity.
func (p prober) identity(ctx context.Context, addr string) (Identity, error) {
	ctx, cancel := context.WithTimeout(ctx, identityTimeout)
	defer cancel()
	var id Identity
	if err := p.get(ctx, addr, "/v1/status/peers", nil, &id.Servers); err != nil {
		return id, err
	}
	if len(id.Servers) == 0 {
		return id, fmt.Errorf("consul %s: /v1/status/peers: no Raft servers yet", addr)
	}
	slices.Sort(id.Servers)
	var dcs []string
	if err := p.get(ctx, addr, "/v1/catalog/datacenters", nil, &dcs); err != nil {
		return id, err
	}
	id.Datacenters = dcs
	switch len(dcs) {
	case 0:
		return id, fmt.Errorf("consul %s: /v1/catalog/datacenters: no datacenter", addr)
	case 1:
		id.Datacenter = dcs[0]
	default:
		dc, err := p.ownDatacenter(ctx, addr, dcs)
		if err != nil {
			return id, err
		}
		id.Datacenter = dc
	}
	var roots struct{ TrustDomain string }
	if err := p.get(ctx, addr, "/v1/connect/ca/roots", nil, &roots); err == nil {
		id.TrustDomain = roots.TrustDomain
	} // an error: Connect is off (500), or an older Consul; the other two decide
	return id, nil
}

// ownDatacenter picks, of the datacenters addr knows, the one whose leader
// is addr's own.
func (p prober) ownDatacenter(ctx context.Context, addr string, dcs []string) (string, error) {
	own, err := p.leader(ctx, addr, nil)
	if err != nil {
		return "", err
	}
	for _, dc := range dcs {
		if l, err := p.leader(ctx, addr, url.Values{"dc": {dc}}); err == nil && l == own {
			return dc, nil
		}
	}
	return "", fmt.Errorf("consul %s: none of its datacenters %s has its leader %s", addr, strings.Join(dcs, ","), own)
}

// leader is addr's answer to /v1/status/leader; no leader is an error.
func (p prober) leader(ctx context.Context, addr string, q url.Values) (string, error) {
	var l string
	if err := p.get(ctx, addr, "/v1/status/leader", q, &l); err != nil {
		return "", err
	}
	if l == "" {
		return "", fmt.Errorf("consul %s: no cluster leader", addr)
	}
	return l, nil
}

// get GETs path from addr and decodes a 200 answer of at most
// maxIdentityAnswer bytes into out.
func (p prober) get(ctx context.Context, addr, path string, q url.Values, out any) error {
	u := url.URL{Scheme: p.scheme, Host: addr, Path: path, RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	rt := p.rt
	if rt == nil {
		rt = http.DefaultTransport
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("consul %s: %s: %w", addr, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxIdentityAnswer+1))
	switch {
	case err != nil:
		return fmt.Errorf("consul %s: %s: %w", addr, path, err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("consul %s: %s: %s: %.200s", addr, path, resp.Status, b)
	case len(b) > maxIdentityAnswer:
		return fmt.Errorf("consul %s: %s: answer over %d bytes", addr, path, maxIdentityAnswer)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("consul %s: %s: %w", addr, path, err)
	}
	return nil
}

// identities reads the Identity of every address at once; errs[i] is
// addrs[i]'s error.
func (p prober) identities(ctx context.Context, addrs []string) ([]Identity, []error) {
	ids, errs := make([]Identity, len(addrs)), make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() { ids[i], errs[i] = p.identity(ctx, a) })
	}
	wg.Wait()
	return ids, errs
}
