package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/worker"
)

// key is one instance as the checker compares them: which cluster's, the
// Consul service name, address and port. IDs and nodes are fleetsync's
// business; what Consul answers a query with is this.
type key struct {
	Cluster, Name, Addr string
	Port                int
}

func (k key) String() string { return fmt.Sprintf("%s/%s@%s:%d", k.Cluster, k.Name, k.Addr, k.Port) }

// entry is one service instance read from Consul.
type entry struct {
	Node, ID    string
	ModifyIndex uint64
	Marked      string // the cluster whose full ownership mark it carries, or ""
	Key         key    // Cluster is Marked
	Rev         string // its "rev" service meta (the model's service-meta-rev annotation)
	Desc        string // service, address, port, tags and meta, for a violation's detail
}

// planted is an entry the soak wrote itself and that fleetsync must never
// modify or delete: a look-alike node and its service, a VM's instances of
// the same service names, a tampered copy of one of fleetsync's entries.
type planted struct {
	What        string
	Node, ID    string // ID "" for a node record
	ModifyIndex uint64
	Fault       int // the fault record that planted it (-1: planted at start)
	Removed     bool
	At          time.Time                      // when it was planted (re-planted)
	reg         *consulapi.CatalogRegistration // how it was written
}

// violation is one broken invariant.
type violation struct {
	At     float64 `json:"at_s"`
	Rule   string  `json:"rule"`
	Fault  string  `json:"fault"`
	Object string  `json:"object"`
	Detail string  `json:"detail"`
}

// faultRec is one injected fault: kind, when, and (for tamper) the one
// instance it concerns.
type faultRec struct {
	Kind   string    `json:"kind"`
	Start  time.Time `json:"-"`
	End    time.Time `json:"-"` // zero while active
	Scope  *key      `json:"-"`
	Detail string    `json:"detail,omitempty"`
	StartS float64   `json:"start_s"`
	EndS   float64   `json:"end_s"`
}

// streak is an instance continuously missing (or extra) since Start.
type streak struct {
	Start    time.Time
	Reported bool
}

// point is one sample of the timeline.
type point struct {
	T       float64 `json:"t_s"`
	Missing int     `json:"missing"`
	Extra   int     `json:"extra"`
	Desired int     `json:"desired"`
	Txns    int64   `json:"txns"`
	OK      bool    `json:"read_ok"`
}

// gapStat is the worst missing or extra time seen, per fault type.
type gapStat struct {
	Worst  float64 `json:"worst_s"`
	Object string  `json:"object"`
	Count  int     `json:"streaks"`
}

// checker holds the invariants. It reads Kubernetes and Consul itself on
// every sample, never fleetsync's view (only /debug/workers, for the
// one-replica-per-Service rule).
type checker struct {
	w     *world
	start time.Time
	bound time.Duration

	mu          sync.Mutex
	faults      []*faultRec
	planted     []*planted
	plantGen    int // bumped when planted entries are re-based (snapshot restore)
	desiredAt   map[key]time.Time
	missing     map[key]*streak
	extra       map[key]*streak
	dups        map[key]*streak      // instances registered more than once
	dual        map[string]int       // Service key -> consecutive samples held by two replicas
	thawedAt    map[string]time.Time // replica id -> when the pause fault thawed it
	gaps        map[string]*gapStat
	extraGaps   map[string]*gapStat
	violations  []violation
	timeline    []point
	last        *reading
	samples     int
	failedReads int
	exactSince  time.Time // zero unless the last sample was exact
	exactRead   time.Time // when the last exact sample began reading (zero unless exact)
	longLogged  int       // long streaks logged (the first 20)
}

// reading is one sample: what Kubernetes wants and what Consul has.
type reading struct {
	At      time.Time
	Desired map[key]bool
	Rev     map[key]string // the "rev" meta a desired instance must carry ("" : any)
	Present map[key][]entry
	Entries map[string]entry // node + "/" + ID -> entry, every node read
	Nodes   map[string]uint64
}

// current reports whether Consul holds an instance of desired key k with
// the values the Service asks for now (its "rev" meta): an instance left
// with an older rev is as good as missing, an update not propagated.
func (r *reading) current(k key) bool {
	want := r.Rev[k]
	for _, e := range r.Present[k] {
		if want == "" || e.Rev == want {
			return true
		}
	}
	return false
}

func newChecker(w *world, bound time.Duration) *checker {
	return &checker{w: w, start: w.start, bound: bound, desiredAt: map[key]time.Time{}, missing: map[key]*streak{},
		extra: map[key]*streak{}, dups: map[key]*streak{}, dual: map[string]int{}, thawedAt: map[string]time.Time{}, gaps: map[string]*gapStat{}, extraGaps: map[string]*gapStat{}}
}

func (c *checker) since(t time.Time) float64 { return t.Sub(c.start).Seconds() }

// faultStart records a fault as active; faultEnd as healed.
func (c *checker) faultStart(kind, detail string, scope *key) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.faults = append(c.faults, &faultRec{Kind: kind, Start: now, Scope: scope, Detail: detail, StartS: c.since(now)})
	c.w.logf("fault %s: %s %s", kind, "injected", detail)
	return len(c.faults) - 1
}

func (c *checker) faultEnd(id int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	f := c.faults[id]
	f.End, f.EndS = now, c.since(now)
	c.w.logf("fault %s: healed after %.1fs", f.Kind, now.Sub(f.Start).Seconds())
}

// thawGrace is how long a replica thawed after its Lease passed on may
// still run workers of the shards it lost: the shards' documented bound, a
// retry period and the renew deadline of the defaults (2 s + 10 s). Its
// first retry tick (late by the pause) reads the Leases and hands the
// shards over, usually within tens of milliseconds; when the API server
// cannot be read then, or the workers take long to stop (a Consul call in
// flight), the elections end it within the bound. Its writes for those
// shards are refused on their fences meanwhile (the instance rules check
// what lands).
const thawGrace = 12 * time.Second

// thawed records that replica id was thawed at at (the pause fault).
func (c *checker) thawed(id string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.thawedAt[id] = at
}

func (c *checker) violate(at time.Time, rule, fault, object, format string, args ...any) {
	v := violation{At: c.since(at), Rule: rule, Fault: fault, Object: object, Detail: fmt.Sprintf(format, args...)}
	c.violations = append(c.violations, v)
	c.w.logf("VIOLATION %s at %.1fs (fault %s) %s: %s", v.Rule, v.At, v.Fault, v.Object, v.Detail)
}

// excuse returns the faults that overlap [from, to] and concern k, and
// until when they excuse a missing or extra k (the latest heal; far future
// while one is active).
//
// The kinds also name faults healed less than recentlyHealed before from:
// a client still backing off after a fault (an informer relisting after
// the apiserver came back) delays what follows it. They excuse nothing.
func (c *checker) excuse(k key, from, to time.Time) (kinds []string, until time.Time) {
	for _, f := range c.faults {
		if f.Scope != nil && *f.Scope != k {
			continue
		}
		if f.Start.After(to) || (!f.End.IsZero() && f.End.Before(from.Add(-recentlyHealed))) {
			continue
		}
		if !slices.Contains(kinds, f.Kind) {
			kinds = append(kinds, f.Kind)
		}
		if !f.End.IsZero() && f.End.Before(from) {
			continue
		}
		end := f.End
		if end.IsZero() {
			end = to.Add(time.Hour)
		}
		if end.After(until) {
			until = end
		}
	}
	sort.Strings(kinds)
	return kinds, until
}

// plant records an entry the soak wrote, read back for its ModifyIndex.
func (c *checker) plant(p *planted) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p.At = time.Now()
	c.planted = append(c.planted, p)
}

// unplant marks the planted entries of fault id as removed by the soak.
func (c *checker) unplant(id int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.planted {
		if p.Fault == id {
			p.Removed = true
		}
	}
}

// tampers lists the tampered entries still planted (a copy of each).
func (c *checker) tampers() []planted {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []planted
	for _, p := range c.planted {
		if p.Fault >= 0 && !p.Removed {
			out = append(out, *p)
		}
	}
	return out
}

// isPlanted reports whether node/id is a planted entry still held.
func (c *checker) isPlanted(node, id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.planted {
		if p.Node == node && p.ID == id && !p.Removed {
			return true
		}
	}
	return false
}

// recentlyHealed: see excuse.
const recentlyHealed = 10 * time.Second

var nodeNumber = regexp.MustCompile(`^\.[0-9]+$`)

// clusterOfNode names the soak cluster whose synthetic node name is, or "".
func (c *checker) clusterOfNode(node string) string {
	for _, cl := range c.w.clusters {
		base := "k8s-" + cl.id
		if node == base || (strings.HasPrefix(node, base) && nodeNumber.MatchString(node[len(base):])) {
			return cl.id
		}
	}
	return ""
}

// markOf returns the cluster whose full ownership mark s carries, or "".
func markOf(s *consulapi.AgentService) string {
	id := s.Meta["k8s-cluster"]
	if id == "" || s.Meta["external-source"] != "kubernetes" || !slices.Contains(s.Tags, id) {
		return ""
	}
	return id
}

// read takes one sample.
func (c *checker) read(ctx context.Context) (*reading, error) {
	r := &reading{At: time.Now(), Desired: map[key]bool{}, Rev: map[key]string{}, Present: map[key][]entry{}, Entries: map[string]entry{}, Nodes: map[string]uint64{}}
	kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, cl := range c.w.clusters {
		svcs, err := c.w.kube.Client.CoreV1().Services(cl.ns).List(kctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list Services %s: %w", cl.ns, err)
		}
		sl, err := c.w.kube.Client.DiscoveryV1().EndpointSlices(cl.ns).List(kctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list EndpointSlices %s: %w", cl.ns, err)
		}
		bySvc := map[string][]*discoveryv1.EndpointSlice{}
		for i := range sl.Items {
			s := &sl.Items[i]
			bySvc[s.Labels[discoveryv1.LabelServiceName]] = append(bySvc[s.Labels[discoveryv1.LabelServiceName]], s)
		}
		for _, svc := range svcs.Items {
			if on, _ := strconv.ParseBool(strings.TrimSpace(svc.Annotations[worker.AnnotationSync])); !on {
				continue
			}
			name := svc.Name
			if v, ok := svc.Annotations[worker.AnnotationName]; ok {
				name = strings.TrimSpace(v)
			}
			for _, s := range bySvc[svc.Name] {
				port := -1
				for _, p := range s.Ports {
					if p.Name != nil && *p.Name == "http" && p.Port != nil {
						port = int(*p.Port)
					}
				}
				if port < 0 {
					continue
				}
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && !*e.Conditions.Ready {
						continue
					}
					for _, a := range e.Addresses {
						k := key{cl.id, name, a, port}
						r.Desired[k] = true
						if rev := svc.Annotations[worker.AnnotationMeta+"rev"]; rev != "" {
							r.Rev[k] = rev
						}
					}
				}
			}
		}
	}
	cl, err := c.w.consulClient()
	if err != nil {
		return nil, err
	}
	qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
	defer qcancel()
	q := (&consulapi.QueryOptions{}).WithContext(qctx)
	nodes, _, err := cl.Catalog().Nodes(q)
	if err != nil {
		return nil, fmt.Errorf("consul nodes: %w", err)
	}
	for _, n := range nodes {
		r.Nodes[n.Node] = n.ModifyIndex
		if c.clusterOfNode(n.Node) == "" && !c.w.plantedNode(n.Node) {
			continue
		}
		list, _, err := cl.Catalog().NodeServiceList(n.Node, q)
		if err != nil {
			return nil, fmt.Errorf("consul node %s: %w", n.Node, err)
		}
		if list == nil {
			continue
		}
		onCluster := c.clusterOfNode(n.Node)
		for _, s := range list.Services {
			e := entry{Node: n.Node, ID: s.ID, ModifyIndex: s.ModifyIndex,
				Desc: fmt.Sprintf("%s %s:%d tags %v meta %v", s.Service, s.Address, s.Port, s.Tags, s.Meta)}
			if m := markOf(s); m != "" && m == onCluster {
				e.Marked = m
				e.Key = key{m, s.Service, s.Address, s.Port}
				e.Rev = s.Meta["rev"]
				r.Present[e.Key] = append(r.Present[e.Key], e)
			}
			r.Entries[n.Node+"/"+s.ID] = e
		}
	}
	return r, nil
}

// workers lists the Services each live replica of a sharded cluster runs
// a worker for.
func (c *checker) workers(ctx context.Context) map[string][]string {
	out := map[string][]string{}
	for _, cl := range c.w.clusters {
		if len(cl.replicas) < 2 {
			continue
		}
		for _, rep := range cl.replicas {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			code, body, err := rep.daemon().Get(ctx, "/debug/workers", "")
			cancel()
			if err != nil || code != http.StatusOK {
				continue
			}
			var ws []struct{ Namespace, Service string }
			if json.Unmarshal([]byte(body), &ws) != nil {
				continue
			}
			for _, w := range ws {
				k := w.Namespace + "/" + w.Service
				out[k] = append(out[k], rep.id)
			}
		}
	}
	return out
}

// sample reads once and checks every invariant against the reading.
func (c *checker) sample(ctx context.Context) {
	c.mu.Lock()
	gen := c.plantGen
	c.mu.Unlock()
	r, err := c.read(ctx)
	ws := c.workers(ctx)
	txns := c.w.txns()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples++
	now := time.Now()
	if err != nil {
		c.failedReads++
		c.timeline = append(c.timeline, point{T: c.since(now), Txns: txns})
		return
	}
	c.judge(r, ws, gen, txns, now)
}

// judge checks every invariant against one reading r taken at now (ws:
// the workers of each replica; gen: the planted generation when r began).
// c.mu is held.
func (c *checker) judge(r *reading, ws map[string][]string, gen int, txns int64, now time.Time) {
	c.last = r
	// (e) one replica per Service: held by two in two samples in a row.
	for k, reps := range ws {
		if len(reps) > 1 && slices.ContainsFunc(reps, func(r string) bool {
			t, ok := c.thawedAt[r]
			return ok && now.Sub(t) < thawGrace
		}) {
			continue // a replica just thawed drops the shards it lost (thawGrace)
		}
		if len(reps) > 1 {
			c.dual[k]++
			if c.dual[k] == 2 {
				kinds, _ := c.excuse(key{}, now.Add(-2*time.Second), now)
				c.violate(now, "one-replica", strings.Join(kinds, "+"), k, "a worker on replicas %v in two samples in a row", reps)
			}
		} else {
			delete(c.dual, k)
		}
	}
	// (a) planted entries untouched.
	if gen == c.plantGen && gen%2 == 0 {
		for _, p := range c.planted {
			if p.Removed || !p.At.Before(r.At) {
				continue // planted after this reading began: it may predate it
			}
			var idx uint64
			var ok bool
			if p.ID == "" {
				idx, ok = r.Nodes[p.Node]
			} else {
				var e entry
				e, ok = r.Entries[p.Node+"/"+p.ID]
				idx = e.ModifyIndex
			}
			obj := p.Node + "/" + p.ID
			kinds, _ := c.excuse(key{}, now.Add(-5*time.Second), now)
			switch {
			case !ok:
				c.violate(now, "foreign-untouched", strings.Join(kinds, "+"), obj, "%s deleted", p.What)
				p.Removed = true
			case idx != p.ModifyIndex:
				c.violate(now, "foreign-untouched", strings.Join(kinds, "+"), obj, "%s modified: ModifyIndex %d -> %d", p.What, p.ModifyIndex, idx)
				p.ModifyIndex = idx
			}
		}
	}
	// (b) missing and extra instances.
	for k := range c.desiredAt {
		if !r.Desired[k] {
			delete(c.desiredAt, k)
		}
	}
	nMissing, nExtra := 0, 0
	for k := range r.Desired {
		if _, ok := c.desiredAt[k]; !ok {
			c.desiredAt[k] = now
		}
		if r.current(k) {
			if s := c.missing[k]; s != nil {
				c.closeStreak(k, s, now, c.gaps)
				delete(c.missing, k)
			}
			continue
		}
		nMissing++
		if c.missing[k] == nil {
			c.missing[k] = &streak{Start: now}
		}
		c.checkStreak(k, c.missing[k], now, "instance-missing")
	}
	for k, s := range c.missing {
		if !r.Desired[k] { // no longer wanted: the streak ends unfinished
			c.closeStreak(k, s, now, c.gaps)
			delete(c.missing, k)
		}
	}
	for k := range r.Present {
		if r.Desired[k] {
			if s := c.extra[k]; s != nil {
				c.closeStreak(k, s, now, c.extraGaps)
				delete(c.extra, k)
			}
			continue
		}
		nExtra++
		if c.extra[k] == nil {
			c.extra[k] = &streak{Start: now}
		}
		c.checkStreak(k, c.extra[k], now, "instance-stale")
	}
	for k, s := range c.extra {
		if len(r.Present[k]) == 0 {
			c.closeStreak(k, s, now, c.extraGaps)
			delete(c.extra, k)
		}
	}
	// An endpoint is one instance: two entries of ours for one key (every
	// endpoint IP of the model is unique) outliving the bound is a bug too.
	nDup := 0
	for k, es := range r.Present {
		if len(es) < 2 {
			continue
		}
		nDup++
		if c.dups[k] == nil {
			c.dups[k] = &streak{Start: now}
		}
		c.checkStreak(k, c.dups[k], now, "instance-duplicate")
	}
	for k := range c.dups {
		if len(r.Present[k]) < 2 {
			delete(c.dups, k)
		}
	}
	if nMissing == 0 && nExtra == 0 && nDup == 0 {
		if c.exactSince.IsZero() {
			c.exactSince = now
		}
		c.exactRead = r.At
	} else {
		c.exactSince, c.exactRead = time.Time{}, time.Time{}
	}
	c.timeline = append(c.timeline, point{T: c.since(now), Missing: nMissing, Extra: nExtra, Desired: len(r.Desired), Txns: txns, OK: true})
}

// checkStreak reports a streak that outlived the bound after the faults
// that excuse it healed.
func (c *checker) checkStreak(k key, s *streak, now time.Time, rule string) {
	if s.Reported {
		return
	}
	kinds, until := c.excuse(k, s.Start, now)
	from := s.Start
	if until.After(from) {
		from = until
	}
	if now.Sub(from) > c.bound {
		s.Reported = true
		fault := "none"
		if len(kinds) > 0 {
			fault = strings.Join(kinds, "+")
		}
		c.violate(now, rule, fault, k.String(), "for %.1fs (%.1fs after the last fault healed; bound %s)%s", now.Sub(s.Start).Seconds(), now.Sub(from).Seconds(), c.bound, c.heldFor(k))
	}
}

// heldFor describes what the last reading found in Consul at k's address
// and port on k's cluster's nodes, marked or not: what a violation's
// reader needs first (an instance missing because someone else's entry
// holds its ID, say).
func (c *checker) heldFor(k key) string {
	if c.last == nil {
		return ""
	}
	suffix := fmt.Sprintf("_%s_%d", k.Addr, k.Port)
	var out []string
	for _, e := range c.last.Entries {
		if c.clusterOfNode(e.Node) != k.Cluster || !strings.HasSuffix(e.ID, suffix) {
			continue
		}
		who := "unmarked"
		if e.Marked != "" {
			who = "marked " + e.Marked + ", rev " + e.Rev
		}
		out = append(out, fmt.Sprintf("%s/%s at index %d (%s): %s", e.Node, e.ID, e.ModifyIndex, who, e.Desc))
	}
	if len(out) == 0 {
		return "; Consul holds nothing at its address and port on the cluster's nodes"
	}
	slices.Sort(out)
	return "; Consul holds at its address and port: " + strings.Join(out, "; ")
}

// closeStreak records how long k was missing (or extra), per fault type
// that overlapped it ("none" when no fault did: plain propagation).
func (c *checker) closeStreak(k key, s *streak, now time.Time, into map[string]*gapStat) {
	d := now.Sub(s.Start).Seconds()
	kinds, _ := c.excuse(k, s.Start, now)
	if len(kinds) == 0 {
		kinds = []string{"none"}
	}
	if d > 10 && c.longLogged < 20 {
		c.longLogged++
		c.w.logf("long streak: %s from %.1fs to %.1fs (%.1fs), faults %v", k, c.since(s.Start), c.since(now), d, kinds)
	}
	for _, kind := range kinds {
		g := into[kind]
		if g == nil {
			g = &gapStat{}
			into[kind] = g
		}
		g.Count++
		if d > g.Worst {
			g.Worst, g.Object = d, k.String()
		}
	}
}

// finish closes the open streaks at the end of the run (a streak still
// open is checked against the bound one last time).
func (c *checker) finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for k, s := range c.missing {
		c.checkStreak(k, s, now, "instance-missing")
		c.closeStreak(k, s, now, c.gaps)
	}
	for k, s := range c.extra {
		c.checkStreak(k, s, now, "instance-stale")
		c.closeStreak(k, s, now, c.extraGaps)
	}
	for k, s := range c.dups {
		c.checkStreak(k, s, now, "instance-duplicate")
	}
	c.missing, c.extra, c.dups = map[key]*streak{}, map[key]*streak{}, map[key]*streak{}
}

// exact reports whether the last sample was exact, and since when.
func (c *checker) exact() (bool, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.exactSince.IsZero(), c.exactSince
}

// exactAfter reports whether the last sample was exact and began reading
// after t: a sample that began before a fault healed says nothing of what
// the heal changed (removing a tampered entry, say).
func (c *checker) exactAfter(t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.exactSince.IsZero() && c.exactRead.After(t)
}

// lastReading is the last successful sample.
func (c *checker) lastReading() *reading {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// pausePlanted stops the planted-entry check until rebase: Consul's state
// is being replaced (a snapshot restore takes every entry back in time,
// the planted ones too).
func (c *checker) pausePlanted() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.plantGen++ // odd: samples skip the planted entries until it is even again
}

// rebase, after pausePlanted and the restore, re-reads the planted entries:
// an entry the restore removed or changed is planted again as it was, and
// its new ModifyIndex becomes the one to hold. Then the check resumes.
func (c *checker) rebase(ctx context.Context, replant func(ctx context.Context, p planted) (uint64, error)) error {
	c.mu.Lock()
	var ps []planted
	for _, p := range c.planted {
		if !p.Removed {
			ps = append(ps, *p)
		}
	}
	c.mu.Unlock()
	var errs []string
	idx := make([]uint64, len(ps))
	for i, p := range ps {
		var err error
		if idx[i], err = replant(ctx, p); err != nil {
			errs = append(errs, err.Error())
		}
	}
	c.mu.Lock()
	for _, p := range c.planted {
		for i, q := range ps {
			if p.Node == q.Node && p.ID == q.ID && !p.Removed && idx[i] != 0 {
				p.ModifyIndex, p.At = idx[i], time.Now()
			}
		}
	}
	c.plantGen++
	c.mu.Unlock()
	if len(errs) > 0 {
		return fmt.Errorf("re-planting after a restore: %s", strings.Join(errs, "; "))
	}
	return nil
}
