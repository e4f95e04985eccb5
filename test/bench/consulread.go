package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"golang.org/x/sync/errgroup"
)

// countNames returns how many Consul service names start with prefix, with
// the catalog index; waitIndex > 0 makes it a blocking query.
func (b *bench) countNames(prefix string, waitIndex uint64, wait time.Duration) (int, uint64, error) {
	q := (&consulapi.QueryOptions{WaitIndex: waitIndex, WaitTime: wait}).WithContext(b.ctx)
	m, meta, err := b.consul.Client.Catalog().Services(q)
	if err != nil {
		return 0, 0, fmt.Errorf("consul /v1/catalog/services: %w", err)
	}
	n := 0
	for name := range m {
		if strings.HasPrefix(name, prefix) {
			n++
		}
	}
	return n, meta.LastIndex, nil
}

// waitNames waits until at least n service names with prefix are in Consul
// and returns when that was first seen. Each Service of at most 63
// endpoints is written as one transaction (node op + a service and a check
// op per instance, at most 128 ops), so a name appears with all of its
// instances at once. Queries block on the catalog index and are at least
// every apart, so that polling does not load Consul.
func (b *bench) waitNames(prefix string, n int, every, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	lastLog := time.Now()
	var index uint64
	for {
		t0 := time.Now()
		got, idx, err := b.countNames(prefix, index, 5*time.Second)
		if err != nil {
			return time.Time{}, err
		}
		if got >= n {
			return time.Now(), nil
		}
		if idx < index {
			idx = 0
		}
		index = idx
		if time.Since(lastLog) > 10*time.Second {
			b.logf("  ... %d of %d services in Consul", got, n)
			lastLog = time.Now()
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("only %d of %d services %s* in Consul after %s", got, n, prefix, timeout)
		}
		if b.daemon != nil && b.daemon.Exited() {
			return time.Time{}, fmt.Errorf("fleetsync exited:\n%s", indent(b.daemon.LogTail(30)))
		}
		if err := sleep(b.ctx, every-time.Since(t0)); err != nil {
			return time.Time{}, err
		}
	}
}

// clusterMeta selects the daemons' Consul nodes (k8s-bench, k8s-bench.1, ...).
var clusterMeta = map[string]string{"k8s-cluster": clusterID}

// nodeState reads every instance on the daemons' nodes whose service name
// starts with prefix: service name -> sorted "address:port" list, and the
// total.
func (b *bench) nodeState(prefix string) (map[string][]string, int, error) {
	nodes, _, err := b.consul.Client.Catalog().Nodes((&consulapi.QueryOptions{NodeMeta: clusterMeta}).WithContext(b.ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("consul /v1/catalog/nodes: %w", err)
	}
	out := map[string][]string{}
	total := 0
	for _, n := range nodes {
		list, _, err := b.consul.Client.Catalog().NodeServiceList(n.Node, (&consulapi.QueryOptions{}).WithContext(b.ctx))
		if err != nil {
			return nil, 0, fmt.Errorf("consul /v1/catalog/node-services/%s: %w", n.Node, err)
		}
		if list == nil {
			continue
		}
		for _, s := range list.Services {
			if !strings.HasPrefix(s.Service, prefix) {
				continue
			}
			out[s.Service] = append(out[s.Service], fmt.Sprintf("%s:%d", s.Address, s.Port))
			total++
		}
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out, total, nil
}

// serviceAddrs reads the instances of one Consul service on our nodes: the
// sorted addresses and the index, blocking when waitIndex > 0.
func (b *bench) serviceAddrs(name string, waitIndex uint64, wait time.Duration) ([]string, uint64, error) {
	q := (&consulapi.QueryOptions{WaitIndex: waitIndex, WaitTime: wait, NodeMeta: clusterMeta}).WithContext(b.ctx)
	entries, meta, err := b.consul.Client.Catalog().Service(name, "", q)
	if err != nil {
		return nil, 0, fmt.Errorf("consul /v1/catalog/service/%s: %w", name, err)
	}
	addrs := make([]string, 0, len(entries))
	for _, e := range entries {
		addrs = append(addrs, e.ServiceAddress)
	}
	sort.Strings(addrs)
	return addrs, meta.LastIndex, nil
}

// waitServiceAddrs waits, with blocking queries, until service name holds
// exactly want (sorted addresses) and returns when it was seen.
func (b *bench) waitServiceAddrs(name string, want []string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	var index uint64
	for {
		got, idx, err := b.serviceAddrs(name, index, time.Second)
		if err != nil {
			return time.Time{}, err
		}
		if equalStrings(got, want) {
			return time.Now(), nil
		}
		if idx < index {
			idx = 0
		}
		index = idx
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("service %s: %d instances, not the %d wanted, after %s", name, len(got), len(want), timeout)
		}
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// catalogMarks are Consul's two catalog-wide indexes (the nodes table's and
// the checks table's: together they move with every catalog write or
// delete, consul.CatalogMarks), read by two requests that return nothing.
func (b *bench) catalogMarks() ([2]uint64, error) {
	_, meta, err := b.consul.Client.Catalog().Nodes((&consulapi.QueryOptions{NodeMeta: map[string]string{"bench-index-probe": "none"}}).WithContext(b.ctx))
	if err != nil {
		return [2]uint64{}, fmt.Errorf("consul /v1/catalog/nodes: %w", err)
	}
	nodes := meta.LastIndex
	_, meta, err = b.consul.Client.Health().Node("bench-index-probe", (&consulapi.QueryOptions{Filter: `CheckID == "" and CheckID != ""`}).WithContext(b.ctx))
	if err != nil {
		return [2]uint64{}, fmt.Errorf("consul /v1/health/node: %w", err)
	}
	return [2]uint64{nodes, meta.LastIndex}, nil
}

// readLimit is Consul's own limit for the daemon's owned-state read: the
// same requests (every node of the daemons' cluster: its services, then
// its checks), readers nodes at a time as the daemon reads them
// (consul.nodeReaders), sent by a bare HTTP client that discards the
// answers. It returns the time and the bytes read.
func (b *bench) readLimit(readers int) (time.Duration, int64, error) {
	nodes, _, err := b.consul.Client.Catalog().Nodes((&consulapi.QueryOptions{NodeMeta: clusterMeta}).WithContext(b.ctx))
	if err != nil {
		return 0, 0, fmt.Errorf("consul /v1/catalog/nodes: %w", err)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: readers, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	get := func(path string) (int64, error) {
		req, err := http.NewRequestWithContext(b.ctx, http.MethodGet, b.consul.HTTPAddr+path, nil)
		if err != nil {
			return 0, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return n, err
	}
	var total atomic.Int64
	g, _ := errgroup.WithContext(b.ctx)
	g.SetLimit(readers)
	start := time.Now()
	for _, n := range nodes {
		g.Go(func() error {
			for _, p := range []string{"/v1/catalog/node-services/", "/v1/health/node/"} {
				got, err := get(p + url.PathEscape(n.Node))
				if err != nil {
					return err
				}
				total.Add(got)
			}
			return nil
		})
	}
	err = g.Wait()
	return time.Since(start), total.Load(), err
}
