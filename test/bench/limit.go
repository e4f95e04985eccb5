package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// limitInflight is how many transactions the limit writer keeps in flight:
// the daemon's default --consul-max-inflight.
const limitInflight = 8

// catalogGroup is one Consul service's instances on one node, as fleetsync
// wrote them: what one fleetsync transaction per Service carried.
type catalogGroup struct {
	node     string
	services []*consulapi.AgentService
	checks   map[string]*consulapi.HealthCheck // by service ID
}

// catalogSnapshot is every instance a cold start left on the cluster's
// nodes, with its check and node, read from Consul: the limit writes
// exactly these entries, on exactly these nodes.
type catalogSnapshot struct {
	label     string
	prefix    string // of the Consul service names
	cold      coldResult
	nodes     map[string]*consulapi.Node
	groups    []catalogGroup
	instances int
}

// snapshotCatalog reads every instance (service + check) fleetsync wrote
// on the cluster's nodes for the services starting with prefix.
func (b *bench) snapshotCatalog(prefix string) (catalogSnapshot, error) {
	s := catalogSnapshot{nodes: map[string]*consulapi.Node{}}
	nodes, _, err := b.consul.Client.Catalog().Nodes((&consulapi.QueryOptions{NodeMeta: clusterMeta}).WithContext(b.ctx))
	if err != nil {
		return s, fmt.Errorf("consul /v1/catalog/nodes: %w", err)
	}
	for _, n := range nodes {
		list, _, err := b.consul.Client.Catalog().NodeServiceList(n.Node, (&consulapi.QueryOptions{}).WithContext(b.ctx))
		if err != nil {
			return s, fmt.Errorf("consul /v1/catalog/node-services/%s: %w", n.Node, err)
		}
		checks, _, err := b.consul.Client.Health().Node(n.Node, (&consulapi.QueryOptions{}).WithContext(b.ctx))
		if err != nil {
			return s, fmt.Errorf("consul /v1/health/node/%s: %w", n.Node, err)
		}
		if list == nil {
			continue
		}
		s.nodes[n.Node] = n
		byID := map[string]*consulapi.HealthCheck{}
		for _, c := range checks {
			byID[c.ServiceID] = c
		}
		byName := map[string]*catalogGroup{}
		for _, svc := range list.Services {
			if !strings.HasPrefix(svc.Service, prefix) {
				continue
			}
			g := byName[svc.Service]
			if g == nil {
				g = &catalogGroup{node: n.Node, checks: map[string]*consulapi.HealthCheck{}}
				byName[svc.Service] = g
			}
			g.services = append(g.services, svc)
			if c := byID[svc.ID]; c != nil {
				g.checks[svc.ID] = c
			}
			s.instances++
		}
		for _, g := range byName {
			sort.Slice(g.services, func(i, j int) bool { return g.services[i].ID < g.services[j].ID })
			s.groups = append(s.groups, *g)
		}
	}
	sort.Slice(s.groups, func(i, j int) bool { return s.groups[i].services[0].ID < s.groups[j].services[0].ID })
	return s, nil
}

// limitNodes serialises the creation of each node as fleetsync's client
// does: the first transaction on a node creates it (CAS on index 0) while
// the others wait, then every transaction carries a CAS on the index it
// was created at.
type limitNodes struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
	index map[string]uint64
}

func (l *limitNodes) lock(node string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.locks[node]
	if m == nil {
		m = &sync.Mutex{}
		l.locks[node] = m
	}
	return m
}

func (l *limitNodes) known(node string) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.index[node]
	return i, ok
}

func (l *limitNodes) set(node string, i uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index[node] = i
}

// txnOps is one transaction of a group in fleetsync's shape: the node op,
// then a service op and a check op per instance (at most 128 ops: larger
// groups are split as fleetsync splits them).
func txnOps(n *consulapi.Node, index uint64, svcs []*consulapi.AgentService, checks map[string]*consulapi.HealthCheck) consulapi.TxnOps {
	ops := consulapi.TxnOps{{Node: &consulapi.NodeTxnOp{Verb: consulapi.NodeCAS, Node: consulapi.Node{
		Node: n.Node, Address: n.Address, Meta: n.Meta, ModifyIndex: index,
	}}}}
	for _, s := range svcs {
		ops = append(ops, &consulapi.TxnOp{Service: &consulapi.ServiceTxnOp{Verb: consulapi.ServiceCAS, Node: n.Node,
			Service: consulapi.AgentService{ID: s.ID, Service: s.Service, Address: s.Address, Port: s.Port, Tags: s.Tags, Meta: s.Meta}}})
		if c := checks[s.ID]; c != nil {
			ops = append(ops, &consulapi.TxnOp{Check: &consulapi.CheckTxnOp{Verb: consulapi.CheckCAS, Check: consulapi.HealthCheck{
				Node: n.Node, CheckID: c.CheckID, Name: c.Name, Status: c.Status, Output: c.Output,
				ServiceID: c.ServiceID, ServiceName: c.ServiceName, Type: c.Type,
			}}})
		}
	}
	return ops
}

// writeLimit writes the snapshot into Consul with raw transactions,
// inflight at a time, and returns how long that took (first send to last
// answer) and how many transactions it sent.
func (b *bench) writeLimit(s catalogSnapshot, inflight int) (time.Duration, int, error) {
	type txn struct {
		node string
		svcs []*consulapi.AgentService
		chk  map[string]*consulapi.HealthCheck
	}
	var txns []txn
	const perTxn = 62 // (128 - 2 guard ops - node op) / 2 ops per instance
	for _, g := range s.groups {
		for i := 0; i < len(g.services); i += perTxn {
			txns = append(txns, txn{g.node, g.services[i:min(i+perTxn, len(g.services))], g.checks})
		}
	}
	nodes := &limitNodes{locks: map[string]*sync.Mutex{}, index: map[string]uint64{}}
	// Every fleetsync transaction starts with its cluster-id claim's guard
	// ops, a check-index and a check-session of the claim key: so do the
	// limit's, on a key of their own.
	guard, err := b.limitGuard()
	if err != nil {
		return 0, 0, err
	}
	kv := b.consul.Client.Txn()
	send := func(ctx context.Context, t txn) error {
		n := s.nodes[t.node]
		idx, ok := nodes.known(t.node)
		if !ok {
			m := nodes.lock(t.node)
			m.Lock()
			defer m.Unlock()
			idx, ok = nodes.known(t.node)
		}
		ops := append(slices.Clone(guard), txnOps(n, idx, t.svcs, t.chk)...)
		okTxn, resp, _, err := kv.Txn(ops, (&consulapi.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("limit transaction on %s: %w", t.node, err)
		}
		if !okTxn {
			return fmt.Errorf("limit transaction on %s rolled back: %v", t.node, resp.Errors)
		}
		if !ok {
			for _, r := range resp.Results {
				if r.Node != nil {
					nodes.set(t.node, r.Node.ModifyIndex)
				}
			}
		}
		return nil
	}
	start := time.Now()
	err = parallelN(b.ctx, inflight, 0, len(txns), func(ctx context.Context, i int) error { return send(ctx, txns[i]) })
	return time.Since(start), len(txns), err
}

// limitGuard locks the limit's guard key with a session and returns the
// ops that check it is unchanged, shaped as fleetsync's claim guard
// (claim.Claim.Ops).
func (b *bench) limitGuard() (consulapi.TxnOps, error) {
	const key = "fleetsync-bench/limit-guard"
	session, _, err := b.consul.Client.Session().Create(&consulapi.SessionEntry{Name: "fleetsync-bench limit", TTL: "10m"}, (&consulapi.WriteOptions{}).WithContext(b.ctx))
	if err != nil {
		return nil, fmt.Errorf("limit guard session: %w", err)
	}
	kv := b.consul.Client.KV()
	if ok, _, err := kv.Acquire(&consulapi.KVPair{Key: key, Value: []byte("limit"), Session: session}, (&consulapi.WriteOptions{}).WithContext(b.ctx)); err != nil || !ok {
		return nil, fmt.Errorf("limit guard key: lock (%v): %v", ok, err)
	}
	pair, _, err := kv.Get(key, (&consulapi.QueryOptions{}).WithContext(b.ctx))
	if err != nil || pair == nil {
		return nil, fmt.Errorf("limit guard key: read back: %v", err)
	}
	return consulapi.TxnOps{
		{KV: &consulapi.KVTxnOp{Verb: consulapi.KVCheckIndex, Key: key, Index: pair.ModifyIndex}},
		{KV: &consulapi.KVTxnOp{Verb: consulapi.KVCheckSession, Key: key, Session: pair.Session}},
	}, nil
}

// writesOnceReady waits until every daemon is ready and Consul is quiet,
// and returns the writes since base.
func (b *bench) writesOnceReady(base consulWrites, ds ...*fixture.Daemon) (consulWrites, error) {
	for _, d := range ds {
		if _, err := waitReady(b.ctx, d, 10*time.Minute); err != nil {
			return consulWrites{}, err
		}
	}
	if _, err := b.quietApplies(5 * time.Second); err != nil {
		return consulWrites{}, err
	}
	after, err := b.consulWrites()
	if err != nil {
		return consulWrites{}, err
	}
	return after.minus(base), nil
}

// snapshotOf reads back what cold start r left in Consul (names starting
// with prefix) for the limit, and checks that it is all there.
func (b *bench) snapshotOf(label, prefix string, r coldResult) (catalogSnapshot, error) {
	s, err := b.snapshotCatalog(prefix)
	if err != nil {
		return s, err
	}
	if s.instances != r.services*r.endpoints {
		return s, fmt.Errorf("snapshot of %s: %d instances, not %d", label, s.instances, r.services*r.endpoints)
	}
	s.label, s.prefix, s.cold = label, prefix, r
	return s, nil
}

// limitAfter measures Consul's limit for what the cold start r left in
// Consul, right after it (so both see the same machine): the cold start's
// instances are read back, the daemon is stopped, a fresh Consul gets the
// same instances from raw transactions, and the ratio is printed. With a
// daemon name, a daemon of that name over namespaces is then started over
// the limit's entries: as they are exactly what it wrote, that costs no
// catalog write (printed, target 0), and it runs on for the next
// scenarios.
func (b *bench) limitAfter(label, prefix string, r coldResult, name string, namespaces ...string) error {
	if !b.opts.has("limit") {
		return nil
	}
	s, err := b.snapshotOf(label, prefix, r)
	if err != nil {
		return err
	}
	b.stopDaemon()
	b.logf("limit: %s, the same %d instances on the same %d nodes into a fresh Consul", label, s.instances, len(s.nodes))
	if err := b.limitOf(s); err != nil {
		return err
	}
	b.limited = true
	if name == "" {
		return nil
	}
	base, err := b.consulWrites()
	if err != nil {
		return err
	}
	d, err := b.startDaemon(name, namespaces)
	if err != nil {
		return err
	}
	w, err := b.writesOnceReady(base, d)
	if err != nil {
		return err
	}
	b.res.add("limit", label+": fleetsync started over the limit's entries: catalog writes", w.txn, "transactions",
		"target 0: the limit wrote exactly what fleetsync writes")
	b.converged, b.convergedAt = true, time.Now()
	return nil
}

// limitOf writes s into a fresh Consul and records the figures.
func (b *bench) limitOf(s catalogSnapshot) error {
	if err := b.restartConsul(); err != nil {
		return err
	}
	base, err := b.consulWrites()
	if err != nil {
		return err
	}
	// The limit's writes are watched as fleetsync's were (the same
	// catalog reads, as often): those reads cost Consul CPU, and both
	// writers must pay it for the ratio to compare the writes alone.
	type sighting struct {
		at  time.Time
		err error
	}
	watched := make(chan sighting, 1)
	procs := append(b.serverPids(), namedPid{"bench (the limit's writer)", os.Getpid()})
	cpu0 := cpuOf(procs)
	req0, err := b.consulRequests()
	if err != nil {
		return err
	}
	start := time.Now()
	go func() {
		at, err := b.waitNames(s.prefix, s.cold.services, pollEvery(s.cold.services), 30*time.Minute)
		watched <- sighting{at, err}
	}()
	took, sent, err := b.writeLimit(s, limitInflight)
	if err != nil {
		return err
	}
	seen := <-watched
	if seen.err != nil {
		return seen.err
	}
	toSeen := seen.at.Sub(start)
	cpu1 := cpuOf(procs)
	req1, err := b.consulRequests()
	if err != nil {
		return err
	}
	reqs := req1.minus(req0)
	if _, err := b.quietApplies(2 * time.Second); err != nil {
		return err
	}
	after, err := b.consulWrites()
	if err != nil {
		return err
	}
	_, total, err := b.nodeState(s.prefix)
	if err != nil {
		return err
	}
	if total != s.instances {
		return fmt.Errorf("limit %s: %d of %d instances in Consul after the writes", s.label, total, s.instances)
	}
	w := after.minus(base)
	inst := float64(s.instances)
	sc := "limit"
	b.res.add(sc, fmt.Sprintf("%s: limit, time to all %s instances seen", s.label, formatValue(inst)), secs(toSeen), "s",
		fmt.Sprintf("%d transactions over %d nodes, %d in flight; first sent -> last seen, watched as fleetsync's cold start", sent, len(s.nodes), limitInflight))
	b.res.add(sc, s.label+": limit, time to the last answer", secs(took), "s", "first sent -> last answered")
	b.res.add(sc, s.label+": limit, instances per second", math.Round(inst/toSeen.Seconds()), "instances/s", "")
	b.res.add(sc, s.label+": limit, Consul FSM time per transaction", math.Round(w.txnMillis/w.txn*100)/100, "ms", w.breakdown())
	b.res.add(sc, s.label+": limit, CPU from first sent to all seen, all processes", cpuSum(cpu1, cpu0), "s CPU", cpuNote(cpu1, cpu0, toSeen))
	b.res.add(sc, s.label+": limit, Consul HTTP requests from first sent to all seen", reqs.total(), "requests",
		"by path, with Consul's time in the handlers (consul_api_http, blocking queries' waits included; the bench's own watch included): "+reqs.String())
	b.res.add(sc, s.label+": fleetsync cold start / limit", math.Round(toSeen.Seconds()/s.cold.toAll.Seconds()*100)/100, "ratio",
		fmt.Sprintf("limit %.2f s / fleetsync %.2f s (both to all seen); target >= 0.8", toSeen.Seconds(), s.cold.toAll.Seconds()))
	return nil
}

// limit runs a cold start of its own and its limit, when no other
// scenario's cold start was measured against the limit in this run.
func (b *bench) limit() error {
	if b.limited {
		return nil
	}
	fmt.Printf("\n== limit: a cold start, then the same instances written straight into a fresh Consul (raw /v1/txn, fleetsync's shape and node layout, %d in flight)\n", limitInflight)
	b.stopDaemon()
	if err := b.restartConsul(); err != nil {
		return err
	}
	if err := b.populate(b.opts.services, b.opts.endpoints); err != nil {
		return err
	}
	r, err := b.coldRun("fleetsync", []string{benchNS, rolloutNS}, svcPrefix, b.opts.services, b.opts.endpoints)
	if err != nil {
		return err
	}
	label := fmt.Sprintf("%s x %d", formatValue(float64(r.services)), r.endpoints)
	b.recordCold(r, label)
	return b.limitAfter(label, svcPrefix, r, "fleetsync", benchNS, rolloutNS)
}
