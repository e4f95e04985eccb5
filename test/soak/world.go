package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"golang.org/x/sync/errgroup"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// cluster is one Kubernetes cluster id syncing into the shared Consul:
// its namespace (both run on the same kube-apiserver), its Services and
// its fleetsync replicas.
type cluster struct {
	id, ns   string
	model    *model
	replicas []*replica
}

// replica is one fleetsync process and the proxy it reaches Consul through
// (which counts its transactions and can stall it).
type replica struct {
	id      string
	cluster *cluster
	args    []string
	proxy   *fixture.StallProxy
	garbage *garbageProxy // in front of proxy: the consul-garbage fault
	server  int           // the Consul server the proxy forwards to
	txns    atomic.Int64
	stalled atomic.Bool
	busy    atomic.Bool // a fault is stopping or restarting it

	mu sync.Mutex
	d  *fixture.Daemon
}

func (r *replica) daemon() *fixture.Daemon {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.d
}

// world is everything one soak run starts.
type world struct {
	ctx    context.Context
	opts   options
	start  time.Time
	logw   io.Writer
	logMu  sync.Mutex
	kube   *stack.Kube
	consul *stack.Consul

	clusters []*cluster
	chk      *checker

	rr           atomic.Int64 // the next Consul server for the checker's reads, in turn
	plantedNodes map[string]bool
	snapMu       sync.Mutex
	snaps        []snapshot
	tampered     []tamperRec // every tampered entry ever planted (under plantMu)
	// plantMu orders a tampered entry's planting and removal with a
	// restore's re-planting: a restore that re-planted an entry the
	// tamper had just removed left it there for good (the run's only
	// violation then: fleetsync rightly leaves someone else's entry be).
	plantMu  sync.Mutex
	stopOnce sync.Once
}

type snapshot struct {
	at   time.Time
	data []byte
}

type tamperRec struct{ node, id string }

func (w *world) logf(format string, args ...any) {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	fmt.Fprintf(w.logw, "[%7.1fs] %s\n", time.Since(w.start).Seconds(), fmt.Sprintf(format, args...))
}

// startServers starts etcd + kube-apiserver and the Consul servers.
func (w *world) startServers() error {
	g, ctx := errgroup.WithContext(w.ctx)
	g.Go(func() error {
		k, err := stack.StartKube(ctx, stack.KubeOptions{})
		w.kube = k
		return err
	})
	g.Go(func() error {
		c, err := stack.StartConsul(ctx, stack.ConsulOptions{Servers: w.opts.servers})
		w.consul = c
		return err
	})
	return g.Wait()
}

// consulClient returns the client of a running Consul server, taking
// them in turn.
func (w *world) consulClient() (*consulapi.Client, error) {
	ss := w.consul.Servers()
	n := int(w.rr.Add(1))
	for i := range ss {
		s := ss[(n+i)%len(ss)]
		if s.Running() {
			return s.Client, nil
		}
	}
	return nil, fmt.Errorf("no Consul server is running")
}

func (w *world) plantedNode(node string) bool { return w.plantedNodes[node] }

// txns is the number of /v1/txn requests every replica has sent.
func (w *world) txns() int64 {
	var n int64
	for _, c := range w.clusters {
		for _, r := range c.replicas {
			n += r.txns.Load()
		}
	}
	return n
}

// txnsBy counts the transactions sent so far by each replica.
func (w *world) txnsBy() map[string]int64 {
	out := map[string]int64{}
	for _, c := range w.clusters {
		for _, r := range c.replicas {
			out[r.id] = r.txns.Load()
		}
	}
	return out
}

// startDaemons starts a proxy and a fleetsync process per replica.
func (w *world) startDaemons() error {
	servers := len(w.consul.Servers())
	i := 0
	for _, c := range w.clusters {
		for _, r := range c.replicas {
			r.server = i % servers
			i++
			p, err := fixture.NewStallProxy(w.consul.Server(r.server).Addr)
			if err != nil {
				return err
			}
			r.proxy = p
			p.Stall(func(req *http.Request, _ []byte) bool {
				if req.Method == "PUT" && req.URL.Path == "/v1/txn" {
					r.txns.Add(1)
				}
				return r.stalled.Load()
			})
			if r.garbage, err = newGarbageProxy(p.Addr()); err != nil {
				return err
			}
			d, err := fixture.SpawnDaemon(w.ctx, fixture.DaemonConfig{
				ClusterID: c.id, Kubeconfig: w.kube.KubeconfigPath, ConsulAddr: r.garbage.addr(),
				Namespaces: []string{c.ns}, Args: r.args, Name: "fleetsync-" + r.id, Tags: w.opts.tags,
			})
			if err != nil {
				return err
			}
			r.d = d
		}
	}
	for _, c := range w.clusters {
		for _, r := range c.replicas {
			if err := r.d.WaitReady(w.ctx, 120*time.Second); err != nil {
				return fmt.Errorf("replica %s: %w", r.id, err)
			}
		}
	}
	return nil
}

// stop ends every process and proxy the run started; once (run calls it
// before the report and defers it for an early return).
func (w *world) stop() { w.stopOnce.Do(w.stopAll) }

func (w *world) stopAll() {
	_ = os.MkdirAll(w.opts.out, 0o755)
	for _, c := range w.clusters {
		for _, r := range c.replicas {
			if d := r.daemon(); d != nil {
				_ = d.Stop()
				// Keep the logs of every process of the replica beside result.json.
				var all []byte
				for i, path := range d.Logs() {
					b, err := os.ReadFile(path)
					if err != nil {
						w.logf("the log of process %d of replica %s is lost: %v", i+1, r.id, err)
						continue
					}
					all = fmt.Appendf(all, "=== process %d of replica %s ===\n", i+1, r.id)
					all = append(all, b...)
				}
				_ = os.WriteFile(filepath.Join(w.opts.out, "fleetsync-"+r.id+".log"), all, 0o644)
				_ = d.Close()
			}
			if r.garbage != nil {
				_ = r.garbage.close()
			}
			if r.proxy != nil {
				_ = r.proxy.Close()
			}
		}
	}
	if w.consul != nil {
		_ = w.consul.Stop()
	}
	if w.kube != nil {
		_ = w.kube.Stop()
	}
	fixture.RemoveBuild()
}

// dumpGoroutines saves every running daemon's goroutines (pprof, debug=2)
// into the out dir: what a replica that stopped syncing is stuck in.
func (w *world) dumpGoroutines() {
	_ = os.MkdirAll(w.opts.out, 0o755)
	for _, r := range w.allReplicas() {
		d := r.daemon()
		if d == nil || !d.Running() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		code, body, err := d.Get(ctx, "/debug/pprof/goroutine?debug=2", "")
		cancel()
		if err == nil && code == http.StatusOK {
			_ = os.WriteFile(filepath.Join(w.opts.out, "goroutines-"+r.id+".txt"), []byte(body), 0o644)
		}
	}
}

// races returns the race detector's reports from every daemon (a -race
// run builds -race daemons).
func (w *world) races() []string {
	var out []string
	for _, c := range w.clusters {
		for _, r := range c.replicas {
			if d := r.daemon(); d != nil {
				out = append(out, d.Races()...)
			}
		}
	}
	return out
}

// newWorld lays out the clusters: alpha with the replicas and shards of
// the options, beta (a second cluster id sharing the Consul, with
// Services of the same names) with one replica.
func newWorld(ctx context.Context, opts options, logw io.Writer) *world {
	w := &world{ctx: ctx, opts: opts, start: time.Now(), logw: logw, plantedNodes: map[string]bool{}}
	a := &cluster{id: "alpha", ns: "soak-alpha"}
	for i := range opts.replicas {
		a.replicas = append(a.replicas, &replica{id: "alpha-" + strconv.Itoa(i), cluster: a,
			args: []string{"--log-level=" + opts.logLevel, "--enable-pprof", "--shards=" + strconv.Itoa(opts.shards), "--lease-namespace=soak-leases", "--replica-id=alpha-" + strconv.Itoa(i)}})
	}
	w.clusters = append(w.clusters, a)
	if opts.servicesB > 0 {
		b := &cluster{id: "beta", ns: "soak-beta"}
		b.replicas = []*replica{{id: "beta-0", cluster: b, args: []string{"--log-level=" + opts.logLevel, "--enable-pprof"}}}
		w.clusters = append(w.clusters, b)
	}
	return w
}

// createServices writes the initial Services of every cluster.
func (w *world) createServices(rng *rand.Rand) error {
	if err := fixtureNamespace(w, "soak-leases"); err != nil {
		return err
	}
	for i, c := range w.clusters {
		n := w.opts.services
		if i > 0 {
			n = w.opts.servicesB
		}
		c.model = newModel(w.kube.Client, c.ns, 10+i, n, rng)
		if err := c.model.create(w.ctx); err != nil {
			return fmt.Errorf("creating %s's Services: %w", c.id, err)
		}
	}
	return nil
}

func fixtureNamespace(w *world, ns string) error { return fixture.Namespace(w.ctx, w.kube.Client, ns) }
