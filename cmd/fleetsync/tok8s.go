package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetsync/fleetsync/consul"
	consulconn "github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/k8s/apply"
	"github.com/fleetsync/fleetsync/k8s/owned"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
	"github.com/fleetsync/fleetsync/supervisor"
	stok8s "github.com/fleetsync/fleetsync/supervisor/tok8s"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

// toK8sConfig is every flag of the Consul -> Kubernetes direction.
type toK8sConfig struct {
	Enabled         bool
	Import          bool
	Mode            string
	Namespace       string
	Prefix          string
	Allow           stringList
	Deny            stringList
	ExcludeTag      string
	RequireTag      string
	Filter          string
	IncludeClusters stringList
	Warning         string
	Critical        string
	AddressTag      string
	Window          time.Duration
	QPS             float64
	Burst           int
	DeletionGrace   time.Duration
	MaxWatches      int
	maxWatchesSet   bool // --to-k8s-max-watches given (flag or variable): honoured as given
	PollEvery       time.Duration
	Domain          string
	AdoptConsulK8s  bool

	shards *stok8s.Shards // with --shards > 1: the shards this replica holds (shardFleet)
}

func (c *toK8sConfig) registerFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "to-k8s", false, "mirror Consul services into Kubernetes: each Consul service that passes the filters becomes a selectorless ClusterIP Service in --k8s-write-namespace with EndpointSlices of its instances (consul-k8s -to-k8s)")
	fs.BoolVar(&c.Import, "to-k8s-import", false, "import mode: fill the EndpointSlices of every selectorless Service annotated "+k8smark.AnnotationConsulService+": <consul service> with that service's instances (the Service stays the user's)")
	fs.StringVar(&c.Mode, "to-k8s-mode", wtok8s.KindEndpointSlices, "what --to-k8s makes of a Consul service: endpointslices (a selectorless ClusterIP Service and EndpointSlices), headless (a selectorless headless Service and EndpointSlices) or externalname (consul-k8s's object: a Service of type ExternalName pointing at <name>.service.<--consul-domain>, no slices); a change replaces fleetsync's Services")
	fs.BoolVar(&c.AdoptConsulK8s, "to-k8s-adopt-consul-k8s", false, "a Service of a mirrored name that is exactly consul-k8s's object of that Consul service (label consul=true, type ExternalName, <name>.service.<--consul-domain>) becomes fleetsync's, once; any other Service of a mirrored name is left alone (NameTaken)")
	fs.StringVar(&c.Domain, "consul-domain", wtok8s.DefaultDomain, "Consul's DNS domain, for --to-k8s-mode=externalname (consul-k8s's -consul-domain)")
	fs.StringVar(&c.Namespace, "k8s-write-namespace", "", "namespace of the Services --to-k8s makes (default $POD_NAMESPACE, else default)")
	fs.StringVar(&c.Prefix, "k8s-service-prefix", "", "prefix of the Services --to-k8s makes (a name that is not a valid Service name is sanitised and hashed)")
	fs.Var(&c.Allow, "to-k8s-allow", "Consul service names to mirror (globs; repeatable or comma-separated; default all)")
	fs.Var(&c.Deny, "to-k8s-deny", "Consul service names never to mirror (globs; deny wins; consul itself is never mirrored)")
	fs.StringVar(&c.ExcludeTag, "to-k8s-exclude-tag", "k8s", "Consul instances with this tag are not mirrored, per instance ('' for none)")
	fs.StringVar(&c.RequireTag, "to-k8s-require-tag", "", "mirror only the Consul instances with this tag (a name none of whose instances has it is not mirrored; '' for all)")
	fs.StringVar(&c.Filter, "to-k8s-filter", "", "a Consul filter expression over the health entries (e.g. Service.Meta.env == \"prod\"): mirror only the instances it selects, evaluated by Consul")
	fs.Var(&c.IncludeClusters, "to-k8s-include-clusters", "other Kubernetes clusters (their cluster ids) whose instances are mirrored; this cluster's own never are")
	fs.StringVar(&c.Warning, "to-k8s-warning", wtok8s.WarningReady, "EndpointSlice conditions of an instance whose checks warn: ready, fallback (serving and terminating: used when nothing is ready) or not-ready")
	fs.StringVar(&c.Critical, "to-k8s-critical", wtok8s.CriticalNotReady, "an instance whose checks are critical: not-ready (kept, not ready) or drop")
	fs.StringVar(&c.AddressTag, "to-k8s-address", "", "a tagged address to use before the service's and the node's address (e.g. lan_ipv4)")
	fs.DurationVar(&c.Window, "to-k8s-window", time.Second, "per-Service batching window of the Kubernetes writes")
	fs.Float64Var(&c.QPS, "to-k8s-qps", 20, "budget of Kubernetes writes per second of the Consul -> Kubernetes direction")
	fs.IntVar(&c.Burst, "to-k8s-burst", 40, "burst allowed above --to-k8s-qps")
	c.MaxWatches = defaultMaxWatches
	fs.Var(setInt{v: &c.MaxWatches, set: &c.maxWatchesSet}, "to-k8s-max-watches", "blocking health queries held at once; past it a worker reads its service every --to-k8s-poll-interval (0: no cap). Over HTTP/1.1 (Consul's HTTP port) each holds a connection, and Consul refuses more than limits.http_max_conns_per_client (200 by default) from one address. Over HTTP/2 (Consul's HTTPS port) they share a few connections, which is what that limit counts: unless this flag is given, there is no cap")
	fs.DurationVar(&c.PollEvery, "to-k8s-poll-interval", 5*time.Second, "how often a worker past --to-k8s-max-watches reads its service")
	fs.DurationVar(&c.DeletionGrace, "to-k8s-deletion-grace", stok8s.DefaultDeletionGrace, "a catalog answer that drops more than half of the mirrored Services and import-mode Services of this datacenter (at least two) is held this long, then the catalog is read again before anything is deleted; an answer Consul filtered by ACLs is held until it no longer drops them")
}

func (c *toK8sConfig) validate() error {
	switch c.Mode {
	case wtok8s.KindEndpointSlices, wtok8s.KindHeadless, wtok8s.KindExternalName:
	default:
		return fmt.Errorf("--to-k8s-mode=%q: must be endpointslices, headless or externalname", c.Mode)
	}
	if errs := validation.IsDNS1123Subdomain(c.Domain); len(errs) > 0 {
		return fmt.Errorf("--consul-domain=%q: %s", c.Domain, errs[0])
	}
	switch c.Warning {
	case wtok8s.WarningReady, wtok8s.WarningFallback, wtok8s.WarningNotReady:
	default:
		return fmt.Errorf("--to-k8s-warning=%q: must be ready, fallback or not-ready", c.Warning)
	}
	if c.Critical != wtok8s.CriticalNotReady && c.Critical != wtok8s.CriticalDrop {
		return fmt.Errorf("--to-k8s-critical=%q: must be not-ready or drop", c.Critical)
	}
	if c.Window < 0 || c.QPS <= 0 || c.Burst < 1 {
		return fmt.Errorf("--to-k8s-window must not be negative, --to-k8s-qps must be positive and --to-k8s-burst at least 1")
	}
	if c.MaxWatches < 0 || c.PollEvery <= 0 {
		return fmt.Errorf("--to-k8s-max-watches=%d --to-k8s-poll-interval=%s: the cap must not be negative, the interval must be positive", c.MaxWatches, c.PollEvery)
	}
	if c.DeletionGrace <= 0 {
		return fmt.Errorf("--to-k8s-deletion-grace=%s: must be positive", c.DeletionGrace)
	}
	if err := (stok8s.Filter{Allow: c.Allow.values, Deny: c.Deny.values}).Validate(); err != nil {
		return fmt.Errorf("--to-k8s-allow/--to-k8s-deny: %w", err)
	}
	if c.Filter != "" {
		if err := watch.ValidateFilter(c.Filter); err != nil {
			return fmt.Errorf("--to-k8s-filter=%q: %w", c.Filter, err)
		}
	}
	return nil
}

// defaultMaxWatches is --to-k8s-max-watches's default: below Consul's
// default limits.http_max_conns_per_client (200), with room for the
// Kubernetes -> Consul direction's requests.
const defaultMaxWatches = 128

// setInt is an int flag that records whether it was given (on the command
// line or by its environment variable).
type setInt struct {
	v   *int
	set *bool
}

func (f setInt) String() string {
	if f.v == nil { // flag's zero-value check
		return "0"
	}
	return strconv.Itoa(*f.v)
}

func (f setInt) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, strconv.IntSize)
	if err != nil {
		return errors.New("want an integer")
	}
	*f.v, *f.set = int(n), true
	return nil
}

// watchCap is the cap of blocking health queries: --to-k8s-max-watches
// when given; else none when Consul speaks HTTP/2 (http2 asks it: one
// request), since Consul's limit counts connections and the queries
// share a few; else the default. A probe that fails keeps the default.
func (c toK8sConfig) watchCap(ctx context.Context, http2 func(context.Context) (bool, error), log hclog.Logger) int {
	if c.maxWatchesSet {
		return c.MaxWatches
	}
	h2, err := http2(ctx)
	switch {
	case err != nil:
		log.Warn("Consul -> Kubernetes: cannot tell whether Consul speaks HTTP/2; keeping the cap of blocking health queries", "max_watches", c.MaxWatches, "error", err)
		return c.MaxWatches
	case !h2:
		return c.MaxWatches
	}
	log.Info("Consul speaks HTTP/2: every health query blocks (no --to-k8s-max-watches cap); the queries share a few connections, and Consul's limits.http_max_conns_per_client counts connections")
	return 0
}

// toK8sFleet is the Consul -> Kubernetes fleet as the HTTP listener sees
// it: its metrics, and its supervisor once running. A nil *toK8sFleet is
// a daemon without that direction.
type toK8sFleet struct {
	metrics *stok8s.Metrics
	sup     atomic.Pointer[stok8s.Supervisor]
}

// newToK8sFleet registers the fleet's metrics with reg when the direction
// is on (--to-k8s or --to-k8s-import), else returns nil.
func newToK8sFleet(c toK8sConfig, reg prometheus.Registerer, perWorker supervisor.PerWorker) *toK8sFleet {
	if !c.Enabled && !c.Import {
		return nil
	}
	n := perWorker.TopK
	if perWorker.All {
		n = -1
	}
	return &toK8sFleet{metrics: stok8s.NewMetrics(reg, n)}
}

// workers is every running to-k8s worker's status (none before the fleet runs).
func (f *toK8sFleet) workers() []wtok8s.Status {
	if f == nil {
		return nil
	}
	if sup := f.sup.Load(); sup != nil {
		return sup.Workers()
	}
	return nil
}

// runToK8s runs the Consul -> Kubernetes fleet until ctx is done.
func runToK8s(ctx context.Context, c toK8sConfig, fleet *toK8sFleet, restCfg *rest.Config, conn *consulconn.Conn, scope consul.Scope,
	cluster ownership.Cluster, reporter wtok8s.Reporter, services *k8s.Watcher, feed *serviceFeed, log hclog.Logger) error {
	mark, err := k8smark.New(cluster.ID())
	if err != nil {
		return err
	}
	ns := c.Namespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = "default"
	}
	// The writes have their own budget (apply.Writer), not the shared
	// client's rate limiter.
	wcfg := rest.CopyConfig(restCfg)
	wcfg.QPS, wcfg.Burst = -1, 0
	kube, err := kubernetes.NewForConfig(wcfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	writer, err := apply.New(kube, mark, apply.Options{QPS: c.QPS, Burst: c.Burst})
	if err != nil {
		return err
	}
	wopts := watch.Options{Datacenter: conn.Datacenter(), Partition: scope.Partition}
	if scope.Namespace != "default" {
		wopts.Namespace = scope.Namespace
	}
	pctx, cancel := context.WithTimeout(ctx, consulconn.DefaultRequestTimeout)
	wopts.MaxWatches, wopts.PollEvery = c.watchCap(pctx, conn.SpeaksHTTP2, log), c.PollEvery
	cancel()
	wopts.Full = func() {
		log.Warn("Consul -> Kubernetes: more services than --to-k8s-max-watches; past the cap each is read every --to-k8s-poll-interval instead of watched (raise Consul's limits.http_max_conns_per_client and the flag together, spread the services over replicas with --shards, or reach Consul over HTTPS, where the queries share a few connections)",
			"max_watches", wopts.MaxWatches, "poll_interval", c.PollEvery)
	}
	wopts.FeedError = func(err error, failures int) {
		if failures&(failures-1) == 0 { // 1, 2, 4, 8...: a Consul that stays down is not a log flood
			log.Warn("Consul -> Kubernetes: change feed of the polled services failed; they are read at their poll until it recovers", "failures", failures, "error", err)
		}
	}
	wopts.Restored = func() {
		log.Warn("Consul -> Kubernetes: Consul's state went back (a snapshot restore, or a Consul that lost its data): the catalog query returned early or its index went back; every watch reads its service again")
	}
	w := conn.NewWatch(wopts)
	fleet.metrics.SetWatches(w.Stats)
	feedCtx, stopFeed := context.WithCancel(ctx)
	feedDone := make(chan struct{})
	go func() { defer close(feedDone); w.Run(feedCtx) }()
	defer func() { stopFeed(); <-feedDone }()
	log.Info("Consul -> Kubernetes", "mirror", c.Enabled, "import", c.Import, "namespace", ns, "prefix", c.Prefix)
	var imports stok8s.Imports
	if c.Import {
		imports = services
	}
	sup := stok8s.New(stok8s.Options{
		Config: wtok8s.Config{Cluster: cluster, Mark: mark, ExcludeTag: c.ExcludeTag, IncludeClusters: c.IncludeClusters.values,
			Warning: c.Warning, Critical: c.Critical, AddressTag: c.AddressTag, Window: c.Window, Kind: c.Mode, Domain: c.Domain,
			AdoptConsulK8s: c.AdoptConsulK8s},
		Mirror: c.Enabled, Namespace: ns, Prefix: c.Prefix, Filter: stok8s.Filter{Allow: c.Allow.values, Deny: c.Deny.values, RequireTag: c.RequireTag},
		Query: watch.Query{Tag: c.RequireTag, Filter: c.Filter}, Catalog: w.Services, Health: w.HealthQuery, Owned: owned.New(kube, mark.Selector(), ""), Writer: writer,
		Reporter: reporter, Log: log, Imports: imports, DeletionGrace: c.DeletionGrace, Metrics: fleet.metrics, Shards: c.shards,
	})
	fleet.sup.Store(sup)
	feed.set(sup.ServiceChanged)
	return sup.Run(ctx)
}

// serviceFeed passes the shared Service informer's changes
// (k8s.WatcherOptions.OnService) to the to-k8s supervisor once it exists;
// the supervisor reads every Service once the informer synced, so what
// comes before is not lost.
type serviceFeed struct {
	mu sync.Mutex
	f  func(k8s.Key)
}

func (s *serviceFeed) set(f func(k8s.Key)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f = f
}

func (s *serviceFeed) changed(k k8s.Key) {
	s.mu.Lock()
	f := s.f
	s.mu.Unlock()
	if f != nil {
		f(k)
	}
}

// shardFleet is the shard Manager's fleet when both directions share the
// shards: a gained or lost shard is the to-k8s units' as well as the
// Services'.
type shardFleet struct {
	*supervisor.Supervisor
	toK8s *stok8s.Shards
}

func (f shardFleet) GainShard(ctx context.Context, k int) {
	f.toK8s.Gain(k)
	f.Supervisor.GainShard(ctx, k)
}

func (f shardFleet) LoseShard(k int) {
	f.toK8s.Lose(k)
	f.Supervisor.LoseShard(k)
}
