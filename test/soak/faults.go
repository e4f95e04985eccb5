package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// Fault kinds, by track: faults of one track never overlap each other;
// the tracks run side by side, so faults of different tracks do.
var tracks = [][]string{
	{"consul-leader-kill9", "consul-follower-restart", "consul-cluster-restart", "consul-snapshot-restore"},
	{"kube-apiserver-restart", "etcd-compaction-relist", "fleetsync-kill9", "fleetsync-sigterm", "consul-stall"},
	{"tampered-entry"},
	{"consul-garbage"},
	{"fleetsync-pause"},
}

// errNotYet: the fault cannot be injected yet (no snapshot old enough, no
// instance to tamper with); the track tries it again later.
var errNotYet = errors.New("not yet")

// allFaults lists every fault kind.
func allFaults() []string {
	var out []string
	for _, t := range tracks {
		out = append(out, t...)
	}
	return out
}

// register writes reg and returns the ModifyIndex of what it wrote (the
// node record's when reg has no service).
func register(ctx context.Context, cl *consulapi.Client, reg *consulapi.CatalogRegistration) (uint64, error) {
	q := (&consulapi.QueryOptions{}).WithContext(ctx)
	if _, err := cl.Catalog().Register(reg, (&consulapi.WriteOptions{}).WithContext(ctx)); err != nil {
		return 0, fmt.Errorf("register %s/%v: %w", reg.Node, reg.Service, err)
	}
	if reg.Service == nil {
		n, _, err := cl.Catalog().Node(reg.Node, q)
		if err != nil || n == nil || n.Node == nil {
			return 0, fmt.Errorf("read node %s back: %v", reg.Node, err)
		}
		return n.Node.ModifyIndex, nil
	}
	list, _, err := cl.Catalog().NodeServiceList(reg.Node, q)
	if err != nil || list == nil {
		return 0, fmt.Errorf("read node %s back: %v", reg.Node, err)
	}
	for _, s := range list.Services {
		if s.ID == reg.Service.ID {
			return s.ModifyIndex, nil
		}
	}
	return 0, fmt.Errorf("%s/%s not found after registering it", reg.Node, reg.Service.ID)
}

// plantAtStart writes the foreign entries that must stay untouched all run
// long: a node named like one of alpha's synthetic nodes but someone
// else's, with a service of one of alpha's names; a VM's instances of two
// of alpha's names; another (stopped) cluster's marked instance.
func (w *world) plantAtStart(ctx context.Context) error {
	cl, err := w.consulClient()
	if err != nil {
		return err
	}
	regs := []struct {
		what string
		reg  *consulapi.CatalogRegistration
	}{
		{"look-alike node k8s-alpha.1023 (someone else's)", &consulapi.CatalogRegistration{Node: "k8s-alpha.1023", Address: "10.250.0.1",
			NodeMeta: map[string]string{"owner": "not-fleetsync"}}},
		{"a service on the look-alike node", &consulapi.CatalogRegistration{Node: "k8s-alpha.1023", Address: "10.250.0.1", SkipNodeUpdate: true,
			Service: &consulapi.AgentService{ID: "lookalike-svc-000", Service: "svc-000", Address: "10.250.0.1", Port: servicePort,
				Tags: []string{"vm"}, Meta: map[string]string{"external-source": "vm"}}}},
		{"a VM's instance of svc-001", &consulapi.CatalogRegistration{Node: "vm-legacy", Address: "10.251.0.1",
			Service: &consulapi.AgentService{ID: "legacy-svc-001", Service: "svc-001", Address: "10.251.0.1", Port: servicePort}}},
		{"a VM's instance of svc-002", &consulapi.CatalogRegistration{Node: "vm-legacy", Address: "10.251.0.1", SkipNodeUpdate: true,
			Service: &consulapi.AgentService{ID: "legacy-svc-002", Service: "svc-002", Address: "10.251.0.1", Port: servicePort}}},
		{"cluster gamma's marked instance of svc-003", &consulapi.CatalogRegistration{Node: "k8s-gamma", Address: "127.0.0.1",
			NodeMeta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "gamma"},
			Service: &consulapi.AgentService{ID: "k8s_gamma_default_svc-003_10.252.0.1_8080", Service: "svc-003", Address: "10.252.0.1", Port: servicePort,
				Tags: []string{"k8s", "gamma"}, Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "gamma"}}}},
	}
	for _, r := range regs {
		if _, err := register(ctx, cl, r.reg); err != nil {
			return err
		}
		w.plantedNodes[r.reg.Node] = true
	}
	// Every index is read once all are written (a registration with
	// SkipNodeUpdate leaves its node record alone; the first one of
	// vm-legacy and k8s-gamma created theirs).
	q := (&consulapi.QueryOptions{}).WithContext(ctx)
	for _, r := range regs {
		var p planted
		if r.reg.Service == nil {
			p = planted{What: r.what, Node: r.reg.Node, Fault: -1, reg: r.reg}
		} else {
			p = planted{What: r.what, Node: r.reg.Node, ID: r.reg.Service.ID, Fault: -1, reg: r.reg}
		}
		list, _, err := cl.Catalog().NodeServiceList(p.Node, q)
		if err != nil || list == nil {
			return fmt.Errorf("reading planted node %s: %v", p.Node, err)
		}
		p.ModifyIndex = list.Node.ModifyIndex
		for _, s := range list.Services {
			if s.ID == p.ID {
				p.ModifyIndex = s.ModifyIndex
			}
		}
		w.chk.plant(&p)
	}
	for _, n := range []struct{ node, addr string }{{"vm-legacy", "10.251.0.1"}, {"k8s-gamma", "127.0.0.1"}} {
		nd, _, err := cl.Catalog().Node(n.node, q)
		if err != nil || nd == nil || nd.Node == nil {
			return fmt.Errorf("reading planted node %s: %v", n.node, err)
		}
		reg := &consulapi.CatalogRegistration{Node: n.node, Address: n.addr, NodeMeta: nd.Node.Meta}
		w.chk.plant(&planted{What: "node record " + n.node, Node: n.node, ModifyIndex: nd.Node.ModifyIndex, Fault: -1, reg: reg})
	}
	return nil
}

// replant writes p again after a snapshot restore when the restore lost or
// changed it, and returns the ModifyIndex to hold from now on.
func (w *world) replant(ctx context.Context, p planted) (uint64, error) {
	cl, err := w.consulClient()
	if err != nil {
		return 0, err
	}
	if held, err := heldAsPlanted(ctx, cl, p); err == nil && held {
		return p.ModifyIndex, nil
	}
	return register(ctx, cl, p.reg)
}

// heldAsPlanted reports whether Consul holds p as it was planted: the
// node record, or the service unmarked, at p's ModifyIndex.
func heldAsPlanted(ctx context.Context, cl *consulapi.Client, p planted) (bool, error) {
	q := (&consulapi.QueryOptions{}).WithContext(ctx)
	if p.ID == "" {
		n, _, err := cl.Catalog().Node(p.Node, q)
		if err != nil {
			return false, err
		}
		return n != nil && n.Node != nil && n.Node.ModifyIndex == p.ModifyIndex, nil
	}
	list, _, err := cl.Catalog().NodeServiceList(p.Node, q)
	if err != nil {
		return false, err
	}
	if list != nil {
		for _, s := range list.Services {
			if s.ID == p.ID && s.ModifyIndex == p.ModifyIndex && markOf(s) == "" {
				return true, nil
			}
		}
	}
	return false, nil
}

// fault runs one fault of kind: injects it, holds it, heals it. Only a
// fault that could not be injected or healed returns an error (a harness
// failure, not a violation).
func (w *world) fault(ctx context.Context, kind string, rng *rand.Rand) error {
	hold := w.opts.holdMin + time.Duration(rng.Int64N(int64(w.opts.holdMax-w.opts.holdMin)+1))
	c := w.consul
	switch kind {
	case "consul-leader-kill9":
		i, err := c.Leader(ctx)
		if err != nil {
			return err
		}
		id := w.chk.faultStart(kind, fmt.Sprintf("server %d, down %s", i, hold.Round(time.Second)), nil)
		if err := c.KillServer(i); err != nil {
			return err
		}
		sleep(ctx, hold)
		err = c.StartServer(context.WithoutCancel(ctx), i)
		w.chk.faultEnd(id)
		return err
	case "consul-follower-restart":
		l, err := c.Leader(ctx)
		if err != nil {
			return err
		}
		n := len(c.Servers())
		j := (l + 1 + rng.IntN(n-1)) % n
		id := w.chk.faultStart(kind, fmt.Sprintf("server %d", j), nil)
		err = c.RestartServer(context.WithoutCancel(ctx), j)
		w.chk.faultEnd(id)
		return err
	case "consul-cluster-restart":
		id := w.chk.faultStart(kind, "kill -9 of every server, data kept", nil)
		err := c.Restart(context.WithoutCancel(ctx))
		w.chk.faultEnd(id)
		return err
	case "consul-snapshot-restore":
		snap, age := w.oldSnapshot(w.opts.snapshotAge)
		if snap == nil {
			return errNotYet
		}
		id := w.chk.faultStart(kind, fmt.Sprintf("a snapshot %s old", age.Round(time.Second)), nil)
		err := w.restore(context.WithoutCancel(ctx), snap)
		w.chk.faultEnd(id)
		return err
	case "kube-apiserver-restart":
		id := w.chk.faultStart(kind, "", nil)
		err := w.kube.RestartAPIServer(context.WithoutCancel(ctx))
		w.chk.faultEnd(id)
		return err
	case "etcd-compaction-relist":
		id := w.chk.faultStart(kind, "etcd compacted to its head, then kube-apiserver restarted: watches resume from a compacted revision and relist", nil)
		err := w.compact(ctx)
		if err == nil {
			err = w.kube.RestartAPIServer(context.WithoutCancel(ctx))
		}
		w.chk.faultEnd(id)
		return err
	case "fleetsync-kill9", "fleetsync-sigterm":
		r := w.allReplicas()[rng.IntN(len(w.allReplicas()))]
		id := w.chk.faultStart(kind, "replica "+r.id, nil)
		r.busy.Store(true)
		d := r.daemon()
		err := d.Restart(context.WithoutCancel(ctx), kind == "fleetsync-kill9")
		if err == nil {
			err = d.WaitReady(context.WithoutCancel(ctx), 120*time.Second)
		}
		r.busy.Store(false)
		w.chk.faultEnd(id)
		return err
	case "consul-stall":
		r := w.allReplicas()[rng.IntN(len(w.allReplicas()))]
		id := w.chk.faultStart(kind, fmt.Sprintf("every request of replica %s held for %s", r.id, hold.Round(time.Second)), nil)
		r.stalled.Store(true)
		sleep(ctx, hold)
		r.stalled.Store(false)
		w.chk.faultEnd(id)
		return nil
	case "tampered-entry":
		return w.tamper(ctx, rng, hold)
	case "consul-garbage":
		return w.garbageFault(ctx, rng, hold)
	case "fleetsync-pause":
		return w.pause(ctx, rng, hold)
	}
	return fmt.Errorf("unknown fault %q", kind)
}

func (w *world) allReplicas() []*replica {
	var out []*replica
	for _, c := range w.clusters {
		out = append(out, c.replicas...)
	}
	return out
}

// tamper re-registers one of alpha's instances, same node and ID, without
// the mark (someone else's entry now), makes its Service change so that
// its worker must write, holds, then removes the entry.
func (w *world) tamper(ctx context.Context, rng *rand.Rand, hold time.Duration) error {
	r := w.chk.lastReading()
	if r == nil {
		return errNotYet
	}
	a := w.clusters[0]
	var cands []key
	for k, es := range r.Present {
		if k.Cluster == a.id && len(es) == 1 {
			cands = append(cands, k)
		}
	}
	if len(cands) == 0 {
		return errNotYet
	}
	slices.SortFunc(cands, func(x, y key) int { return strings.Compare(x.String(), y.String()) })
	k := cands[rng.IntN(len(cands))]
	e := r.Present[k][0]
	cl, err := w.consulClient()
	if err != nil {
		return errNotYet // Consul is down: try another time
	}
	n, _, err := cl.Catalog().Node(e.Node, (&consulapi.QueryOptions{}).WithContext(ctx))
	if err != nil || n == nil || n.Node == nil {
		return errNotYet
	}
	reg := &consulapi.CatalogRegistration{Node: e.Node, Address: n.Node.Address, SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: e.ID, Service: k.Name, Address: k.Addr, Port: k.Port,
			Tags: []string{"tampered"}, Meta: map[string]string{"tampered-by": "soak"}}}
	id := w.chk.faultStart("tampered-entry", fmt.Sprintf("%s/%s (%s) re-registered without the mark, for %s", e.Node, e.ID, k, hold.Round(time.Second)), &k)
	w.plantMu.Lock()
	idx, err := register(ctx, cl, reg)
	if err != nil {
		// Consul went away meanwhile, maybe after the register committed
		// (a leader killed before it answered): an entry left there would
		// stay someone else's for good, which fleetsync rightly leaves
		// alone (found by TestSoakQuick, the register answered with an
		// error as the leader was killed 0.1 s later, and the entry stood).
		err = w.untamper(context.WithoutCancel(ctx), e.Node, e.ID)
		w.plantMu.Unlock()
		w.chk.faultEnd(id)
		return err
	}
	w.tampered = append(w.tampered, tamperRec{e.Node, e.ID})
	w.chk.plant(&planted{What: "tampered entry " + k.String(), Node: e.Node, ID: e.ID, ModifyIndex: idx, Fault: id, reg: reg})
	w.plantMu.Unlock()
	// The Service must change while the entry is someone else's, so that
	// its worker finds out (a CAS conflict). Retried while the apiserver
	// is away: without it, removing the entry later would be plain drift,
	// which fleetsync repairs at its anti-entropy pass, not within the bound.
	svc := strings.TrimSuffix(k.Name, "-alt")
	for deadline := time.Now().Add(60 * time.Second); ; {
		err := a.model.touch(context.WithoutCancel(ctx), svc)
		if err == nil || time.Now().After(deadline) || strings.Contains(err.Error(), "no Service") {
			if err != nil {
				w.logf("tamper: touching %s: %v", svc, err)
			}
			break
		}
		sleep(context.WithoutCancel(ctx), 500*time.Millisecond)
	}
	sleep(ctx, hold)
	w.plantMu.Lock()
	w.chk.unplant(id)
	err = w.untamper(context.WithoutCancel(ctx), e.Node, e.ID)
	w.plantMu.Unlock()
	w.chk.faultEnd(id)
	return err
}

// untamper removes a tampered entry (if it is still not fleetsync's).
func (w *world) untamper(ctx context.Context, node, id string) error {
	err := w.withConsul(ctx, func(cl *consulapi.Client) error {
		list, _, err := cl.Catalog().NodeServiceList(node, (&consulapi.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return err
		}
		for _, s := range list.Services {
			if s.ID == id && markOf(s) == "" {
				_, err = cl.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: node, ServiceID: id}, (&consulapi.WriteOptions{}).WithContext(ctx))
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("removing tampered entry %s/%s: %w", node, id, err)
	}
	return nil
}

// withConsul runs f on a running server's client until it succeeds, for
// up to a minute (a server may be down for a fault meanwhile).
func (w *world) withConsul(ctx context.Context, f func(*consulapi.Client) error) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		cl, err := w.consulClient()
		if err == nil {
			if err = f(cl); err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return err
		}
		sleep(ctx, 500*time.Millisecond)
	}
}

// snapshots saves a snapshot every interval until ctx ends.
func (w *world) snapshots(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cl, err := w.consulClient()
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rc, _, err := cl.Snapshot().Save((&consulapi.QueryOptions{}).WithContext(sctx))
		var b []byte
		if err == nil {
			b, err = io.ReadAll(rc)
			rc.Close()
		}
		cancel()
		if err != nil {
			continue
		}
		w.snapMu.Lock()
		w.snaps = append(w.snaps, snapshot{at: time.Now(), data: b})
		if len(w.snaps) > 8 {
			w.snaps = w.snaps[1:]
		}
		w.snapMu.Unlock()
	}
}

// oldSnapshot is the newest snapshot at least age old.
func (w *world) oldSnapshot(age time.Duration) ([]byte, time.Duration) {
	w.snapMu.Lock()
	defer w.snapMu.Unlock()
	for i := len(w.snaps) - 1; i >= 0; i-- {
		if d := time.Since(w.snaps[i].at); d >= age {
			return w.snaps[i].data, d
		}
	}
	return nil, 0
}

// restore restores snap (as `consul snapshot restore` does), then
// settles the planted entries (afterRestore).
func (w *world) restore(ctx context.Context, snap []byte) (err error) {
	w.chk.pausePlanted()
	settled := false
	defer func() { // the planted-entry check resumes whatever happens
		if !settled {
			w.plantMu.Lock()
			_ = w.chk.rebase(ctx, w.replant)
			w.plantMu.Unlock()
		}
	}()
	for try := 0; try < 10; try++ {
		var cl *consulapi.Client
		if cl, err = w.consulClient(); err == nil {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = cl.Snapshot().Restore((&consulapi.WriteOptions{}).WithContext(rctx), bytes.NewReader(snap))
			cancel()
			if err == nil {
				break
			}
		}
		sleep(ctx, time.Second)
	}
	if err != nil {
		return fmt.Errorf("snapshot restore: %w", err)
	}
	if _, err := w.consul.Leader(ctx); err != nil {
		return err
	}
	settled = true
	return w.afterRestore(ctx)
}

// afterRestore settles the planted entries after a snapshot restore took
// every entry back in time, with no tamper planting or removing one
// meanwhile (plantMu), then resumes the planted-entry check:
//
//   - A tampered entry the restore undid (Consul holds fleetsync's entry
//     under its ID again, or nothing) is not planted again: the tamper
//     ends there. Written again, it could land over the entry fleetsync
//     had just written after the restore, with no change of its Service
//     to tell fleetsync: removed at the end of the tamper, it would be a
//     delete fleetsync never saw (drift, repaired at the anti-entropy
//     pass, not within the bound; found by the soak: one instance missing
//     to the end of a run).
//   - A tampered entry the soak had removed and the restore brought back
//     is removed again.
//   - Every other planted entry the restore lost or changed is planted
//     again as it was (rebase).
func (w *world) afterRestore(ctx context.Context) error {
	w.plantMu.Lock()
	defer w.plantMu.Unlock()
	rebased := false
	defer func() {
		if !rebased {
			_ = w.chk.rebase(ctx, w.replant)
		}
	}()
	for _, p := range w.chk.tampers() {
		var held bool
		err := w.withConsul(ctx, func(cl *consulapi.Client) (err error) {
			held, err = heldAsPlanted(ctx, cl, p)
			return err
		})
		if err != nil {
			return fmt.Errorf("reading %s: %w", p.What, err)
		}
		if !held {
			w.chk.unplant(p.Fault)
			w.logf("tamper: %s was undone by the restore; not planted again", p.What)
		}
	}
	for _, t := range w.tampered {
		if w.chk.isPlanted(t.node, t.id) {
			continue
		}
		if err := w.untamper(ctx, t.node, t.id); err != nil {
			return err
		}
	}
	rebased = true
	return w.chk.rebase(ctx, w.replant)
}

// compact compacts etcd to its current revision (etcd's JSON gateway).
func (w *world) compact(ctx context.Context) error {
	post := func(path, body string) (map[string]any, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.kube.EtcdHTTPURL+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("etcd %s: HTTP %d %s", path, resp.StatusCode, b)
		}
		var out map[string]any
		return out, json.Unmarshal(b, &out)
	}
	r, err := post("/v3/kv/range", `{"key":"AA==","limit":1}`)
	if err != nil {
		return err
	}
	h, _ := r["header"].(map[string]any)
	rev, _ := h["revision"].(string)
	if rev == "" {
		return fmt.Errorf("etcd range: no header revision in %v", r)
	}
	_, err = post("/v3/kv/compaction", fmt.Sprintf(`{"revision":%q,"physical":true}`, rev))
	return err
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
