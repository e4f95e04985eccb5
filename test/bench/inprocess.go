package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/budget"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/supervisor"
	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/worker"
)

// The in-process scenario's identities: one cluster id (so one Consul node)
// per shard of Services, its own names.
const (
	inprocCluster = "inproc" // + "-<shard>"
	inprocPrefix  = "inp-"
)

// memSource is an in-memory supervisor.Watcher: a fixed set of Services,
// each a view built on demand (as k8s.Watcher builds one from its caches on
// every call) from a compact description. It stands in for the informers;
// from the handler on, the path is the product's: supervisor, workers,
// desired state, diff, write budget, Consul client.
type memSource struct {
	keys     []k8s.Key
	services map[k8s.Key]memService
	ann      map[string]string // shared: the views are read-only

	handler k8s.Handler
	synced  chan struct{}
	wg      sync.WaitGroup
}

type memService struct {
	uid       types.UID
	base, off int
	n         int
}

var _ supervisor.Watcher = (*memSource)(nil)

// newMemSource holds Services [from, to) of e endpoints each, in namespace ns.
func newMemSource(ns string, from, to, e int) *memSource {
	s := &memSource{
		keys:     make([]k8s.Key, 0, to-from),
		services: make(map[k8s.Key]memService, to-from),
		ann:      map[string]string{worker.AnnotationSync: "true"},
		synced:   make(chan struct{}),
	}
	for i := from; i < to; i++ {
		k := k8s.Key{Namespace: ns, Name: inprocName(i)}
		s.keys = append(s.keys, k)
		s.services[k] = memService{uid: types.UID(fmt.Sprintf("uid-%d", i)), base: ipBase(i), n: e}
	}
	return s
}

func inprocName(i int) string { return fmt.Sprintf("%s%06d", inprocPrefix, i) }

func (s *memSource) SetHandler(h k8s.Handler) { s.handler = h }

// Start "lists" every Service (one Changed each, as an informer's initial
// list does) and then reports synced.
func (s *memSource) Start(ctx context.Context) {
	s.wg.Go(func() {
		for _, k := range s.keys {
			if ctx.Err() != nil {
				return
			}
			if s.handler != nil {
				s.handler.Changed(k)
			}
		}
		close(s.synced)
	})
}

func (s *memSource) Wait() { s.wg.Wait() }

func (s *memSource) WaitForSync(ctx context.Context) bool {
	select {
	case <-s.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *memSource) Keys() []k8s.Key { return slices.Clone(s.keys) }

// Service builds the view, endpoints sorted by address as k8s.Watcher's are.
// Head is Service without the endpoints.
func (s *memSource) Head(key k8s.Key) (*k8s.Service, bool, error) {
	m, ok := s.services[key]
	if !ok {
		return nil, false, nil
	}
	return &k8s.Service{
		Key: key, UID: m.uid, Type: corev1.ServiceTypeClusterIP, Annotations: s.ann,
		Ports: []k8s.Port{{Name: "http", Port: 80, Protocol: "TCP"}},
	}, true, nil
}

func (s *memSource) Service(key k8s.Key) (*k8s.Service, bool, error) {
	m, ok := s.services[key]
	if !ok {
		return nil, false, nil
	}
	eps := fixture.IPs(m.base, m.off, m.n)
	out := make([]k8s.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = k8s.Endpoint{Address: e.IP, Ports: map[string]int32{"http": 80}, Ready: true, Serving: true, Pod: e.Pod}
	}
	slices.SortFunc(out, func(a, b k8s.Endpoint) int { return strings.Compare(a.Address, b.Address) })
	return &k8s.Service{
		Key: key, UID: m.uid, Type: corev1.ServiceTypeClusterIP, Annotations: s.ann,
		Ports:     []k8s.Port{{Name: "http", Port: 80, Protocol: "TCP"}},
		Endpoints: out,
	}, true, nil
}

// inprocess runs the fleet in this process from memSources against the real
// Consul (emptied first). Services are split into shards of
// --inprocess-shard, each with its own cluster id and so its own Consul node,
// as separately configured replicas would be: Consul 1.14 spends time
// proportional to the instances already on a node for every instance written
// to it (its event publisher reads all of the node's checks), which makes one
// node of 100,000 instances take hours to fill. All shards share one write
// budget (8 transactions in flight, the daemon's default), so Consul sees one
// daemon's load.
func (b *bench) inprocess() error {
	n, e, per := b.opts.inprocServices, b.opts.inprocEndpoints, b.opts.inprocShard
	shards := (n + per - 1) / per
	const label = "in-process event source, not the real API server"
	fmt.Printf("\n== inprocess (%s): %s Services x %d endpoints, %d cluster ids (Consul nodes) of %s Services\n",
		label, formatValue(float64(n)), e, shards, formatValue(float64(per)))
	b.stopDaemon()
	if err := b.restartConsul(); err != nil {
		return err
	}
	heap0 := heapInuse()
	srcs := make([]*memSource, shards)
	for i := range srcs {
		srcs[i] = newMemSource(fmt.Sprintf("%s-%03d", inprocCluster, i), i*per, min((i+1)*per, n), e)
	}
	heap1 := heapInuse()

	ccfg := consulapi.DefaultConfig() // as the daemon builds its client
	ccfg.Address, ccfg.Scheme, ccfg.Token, ccfg.TokenFile = b.consul.Addr, "http", "", ""
	capi, err := consulapi.NewClient(ccfg)
	if err != nil {
		return err
	}
	budget := budget.New(0, 10, 8)
	log := hclog.New(&hclog.LoggerOptions{Name: "fleetsync-inprocess", Level: hclog.Warn, Output: os.Stderr})
	sups := make([]*supervisor.Supervisor, shards)
	for i := range sups {
		cluster, err := ownership.New(fmt.Sprintf("%s-%03d", inprocCluster, i))
		if err != nil {
			return err
		}
		// Wired as cmd/fleetsync wires the daemon, with its defaults.
		reg := prometheus.NewRegistry()
		metrics := supervisor.NewMetrics(reg, supervisor.PerWorker{All: true})
		// The fleets share one address, as one daemon's reads do: their
		// read bounds together stay under Consul's 200 connections per
		// client (100 fleets of the default 32 got 429s once the
		// anti-entropy passes read node indexes too).
		store := consul.NewClient(capi, cluster, consul.Options{Budget: budget, Observe: metrics.ObserveTxn, ObserveWait: metrics.ObserveWait,
			MaxReads: max(1, 100/shards)})
		sups[i] = supervisor.New(supervisor.Options{
			Selector: supervisor.Selector{Allow: []string{"*"}, Deny: []string{"kube-system"}},
			Worker: worker.Config{Cluster: cluster, DefaultWindow: time.Second, K8sTag: "k8s",
				Terminating: worker.TerminatingWarning},
			Watcher: srcs[i], Store: store, Log: log, DrainTimeout: 10 * time.Second,
			ResyncPeriod: 5 * time.Minute, NodeCheckInterval: 10 * time.Second, Metrics: metrics,
		})
	}

	base, err := b.quietApplies(2 * time.Second)
	if err != nil {
		return err
	}
	cpu0, _ := cpuSeconds(os.Getpid())
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	start := time.Now()
	for _, sup := range sups {
		wg.Go(func() { _ = sup.Run(ctx) })
	}
	booted := make(chan time.Time, 1)
	go func() {
		for _, sup := range sups {
			for ctx.Err() == nil && !sup.Bootstrapped() {
				time.Sleep(5 * time.Millisecond)
			}
		}
		booted <- time.Now()
	}()
	every := 250 * time.Millisecond
	if n > 20000 {
		every = time.Second
	}
	seen, err := b.waitNames(inprocPrefix, n, every, 60*time.Minute)
	if err != nil {
		return err
	}
	toAll := seen.Sub(start)
	cpu1, _ := cpuSeconds(os.Getpid())
	if err := b.checkInprocInstances(n, e); err != nil {
		return err
	}
	after, err := b.quietApplies(2 * time.Second)
	if err != nil {
		return err
	}
	heap2 := heapInuse()
	rss, _, _ := memStatus(os.Getpid())
	crss, _, _ := memStatus(b.consul.Agent().Pid())

	sc := "inprocess"
	inst := float64(n * e)
	size := fmt.Sprintf("%s x %d", formatValue(float64(n)), e)
	b.res.add(sc, size+": time to all instances in Consul", secs(toAll), "s", fmt.Sprintf("%s; %d Consul nodes", label, shards))
	select {
	case bootAt := <-booted:
		b.res.add(sc, size+": bootstrap (synced + owned state read)", secs(bootAt.Sub(start)), "s", "")
	default:
	}
	b.res.add(sc, size+": Raft applies used", after-base, "applies", fmt.Sprintf("%.2f per Service", (after-base)/float64(n)))
	b.res.add(sc, size+": instances per second", math.Round(inst/toAll.Seconds()), "instances/s", "")
	b.res.add(sc, size+": CPU of this process during the cold start", math.Round((cpu1-cpu0)*10)/10, "s CPU", fmt.Sprintf("%.0f µs per Service", (cpu1-cpu0)/float64(n)*1e6))
	b.res.add(sc, size+": Go heap of supervisors + workers + client", math.Round((heap2-heap1)/mib*10)/10, "MiB", "heap in use after GC, minus the event source's")
	b.res.add(sc, size+": heap per worker", math.Round((heap2-heap1)/float64(n)/1024*100)/100, "KiB", "no informer caches in this mode")
	b.res.add(sc, size+": event source's own heap", math.Round((heap1-heap0)/mib*10)/10, "MiB", "not fleetsync's")
	b.res.add(sc, size+": benchmark process RSS", math.Round(rss/mib), "MiB", "everything in this process")
	b.res.add(sc, size+": Consul agent RSS", math.Round(crss/mib), "MiB", "the dev agent holding the instances")

	// Idle at this size.
	idleFor := min(b.opts.idle, 30*time.Second)
	w, err := b.idleWindow(os.Getpid(), idleFor)
	if err != nil {
		return err
	}
	b.res.add(sc, size+": Raft applies per minute while idle", math.Round(w.applies/w.elapsed.Minutes()*100)/100, "applies/min", fmt.Sprintf("over %s", w.elapsed.Round(time.Second)))
	b.res.add(sc, size+": CPU while idle", math.Round(w.cpu/w.elapsed.Seconds()*100*1000)/1000, "% of a core", "the whole benchmark process")
	return nil
}

// checkInprocInstances verifies the instance count of a sample of 200
// Services spread over all of them.
func (b *bench) checkInprocInstances(n, e int) error {
	for i := 0; i < n; i += max(1, n/200) {
		q := (&consulapi.QueryOptions{}).WithContext(b.ctx)
		entries, _, err := b.consul.Client.Catalog().Service(inprocName(i), "", q)
		if err != nil {
			return err
		}
		if len(entries) != e {
			return fmt.Errorf("service %s: %d instances, want %d", inprocName(i), len(entries), e)
		}
	}
	return nil
}

func heapInuse() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse)
}
