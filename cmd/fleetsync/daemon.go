package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/budget"
	"github.com/fleetsync/fleetsync/consul/claim"
	consulconn "github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/supervisor"
	"github.com/fleetsync/fleetsync/supervisor/shard"
	stok8s "github.com/fleetsync/fleetsync/supervisor/tok8s"
)

// daemon wires the components and runs them until ctx is done.
func daemon(ctx context.Context, cfg config, logOut io.Writer) error {
	log := hclog.New(&hclog.LoggerOptions{
		Name: "fleetsync", Level: hclog.LevelFromString(cfg.LogLevel), JSONFormat: cfg.LogJSON, Output: logOut,
	}).With("cluster", cfg.ClusterID)
	mem := planMemory(os.Getenv, cgroupMemoryLimit)
	mem.apply()
	cluster, err := ownership.New(cfg.ClusterID)
	if err == nil && cfg.ConsulNodes > 0 {
		cluster, err = cluster.WithNodes(cfg.ConsulNodes)
	}
	if err != nil {
		return err
	}
	restCfg, err := kubeConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	tuneKubeClient(restCfg, cfg)
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	conn, err := newConsulConn(ctx, cfg, log)
	if err != nil {
		return err
	}
	tokens := conn.Tokens()
	defer conn.logout(log)
	for _, w := range conn.InsecureTLSWarnings() {
		log.Warn("Insecure Consul connection", "problem", w)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	perWorker, _ := supervisor.ParsePerWorker(cfg.MetricsPerWorker) // validated
	metrics := supervisor.NewMetrics(reg, perWorker)
	toK8s := newToK8sFleet(cfg.ToK8s, reg, perWorker)
	var sup *supervisor.Supervisor
	release := newReleaser(func() bool { return sup != nil && sup.Bootstrapped() }, mem.GCPercent)
	store := consul.NewConnClient(conn.Conn, cluster, consul.Options{
		Budget: budget.New(cfg.MaxWrites, cfg.WriteBurst, cfg.MaxInflight),
		Observe: func(ops int, seconds float64, err error) {
			release.active()
			metrics.ObserveTxn(ops, seconds, err)
		},
		ObserveWait:    metrics.ObserveWait,
		RequestTimeout: cfg.ConsulTimeout,
		Scope:          conn.scope,
		Namespaces:     conn.namespaceEnsurer(),
	})
	health := conn.NewHealth(nil)
	health.Timeout = cfg.ConsulTimeout
	ready := &readiness{sup: nil, health: health, grace: cfg.ConsulGrace}
	recorder := k8s.NewRecorder(kube, "fleetsync", log.Named("events"))
	defer recorder.Shutdown()

	reserved := &supervisor.ReservedTags{}
	imports := &serviceFeed{} // to-k8s import mode (tok8s.go)
	watcher := k8s.NewWatcherWith(kube, k8s.WatcherOptions{
		Resync: cfg.Resync, Nodes: true, Ingresses: cfg.EnableIngress, Log: log.Named("k8s"), OnService: imports.changed,
	})
	// The shard manager is built with the supervisor as its fleet: the
	// fences and the loss check reach it through closures (it is set
	// below, before anything runs).
	var shards *shard.Manager
	sc := shardConfig(cfg.Shard, os.Getenv, os.Hostname)
	var confirmShards func(context.Context, []int) ([]int, error)
	if cfg.Shard.Shards > 1 {
		confirmShards = func(ctx context.Context, held []int) ([]int, error) { return shards.Confirm(ctx, held) }
	}
	sup = supervisor.New(supervisor.Options{
		Selector:          selector(cfg),
		Worker:            workerConfig(cfg, cluster, reserved.Lookup),
		Watcher:           watcher,
		Store:             store,
		Metrics:           metrics,
		Reporter:          recorder,
		Log:               log,
		Shards:            cfg.Shard.Shards,
		ConfirmShards:     confirmShards,
		AutoNodes:         cfg.ConsulNodes == 0,
		DrainTimeout:      cfg.ShutdownTimeout,
		ResyncPeriod:      cfg.ResyncPeriod,
		NodeCheckInterval: cfg.NodeCheck,
		// A key nobody writes: Consul answers a read of a missing key
		// with the whole KV table's index (an existing key's is its own).
		StateKey: strings.TrimSuffix(cfg.ClaimPrefix, "/") + "/" + cfg.ClusterID + ".index-probe",
		Fencing:  fencing(cfg, sc, conn.Conn, conn.scope, metrics, func(k int) { shards.Fenced(k) }, log),
	})
	if err := sup.Selector().Validate(); err != nil {
		return err
	}
	ready.sup = sup
	if cfg.Shard.Shards > 1 {
		cfg.ToK8s.shards = stok8s.NewShards(sc.Shards) // to-k8s units hash into the same shards
		shards, err = shard.New(sc, shard.Deps{Client: kube, ClusterID: cfg.ClusterID, Fleet: shardFleet{sup, cfg.ToK8s.shards}, Log: log.Named("shards")})
		if err != nil {
			return err
		}
		ready.shards = shards
		log.Info("Sharding", "shards", sc.Shards, "replica", sc.ReplicaID, "lease_namespace", sc.Namespace)
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %w", cfg.HTTPAddr, err)
	}
	srv := &http.Server{Handler: newMux(sup, toK8s, reg, ready, cfg), ReadHeaderTimeout: 10 * time.Second}
	if consul.BrokenBuild() {
		log.Error("THIS IS A DELIBERATELY BROKEN TEST BUILD (-tags fleetsync_broken_nodelete): it never deletes an instance; never run it against a real Consul")
	}
	log.Info("Starting", "version", version, "http_addr", ln.Addr().String(), "consul", strings.Join(conn.Addresses(), ","), "consul_tls", conn.TLS(), "consul_token_file", conn.TokenFile(),
		"consul_login_auth_method", conn.authMethod, "consul_datacenter", conn.Datacenter(), "consul_namespace", conn.scope.Namespace, "consul_namespace_mirroring", conn.scope.MirrorNamespaces, "consul_partition", conn.scope.Partition,
		"gc_percent", mem.GCPercent, "gc_percent_at_bootstrap", mem.BootGCPercent, "memory_limit_bytes", mem.Limit)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	g.Go(func() error { return tokens.Watch(gctx, 5*time.Second) })
	g.Go(func() error { release.run(gctx); return nil })
	g.Go(func() error {
		select {
		case <-sup.BootstrapDone():
			release.booted() // the bootstrap's GC target ends with it
		case <-gctx.Done():
		}
		return nil
	})
	if shards != nil {
		// An error (the Leases forbidden: RBAC) stops the process: a
		// replica that can hold no shard must not run as if it could.
		g.Go(func() error { return shards.Run(gctx) })
	}
	g.Go(func() error { return health.Run(gctx, min(5*time.Second, cfg.ConsulGrace/2)) })
	g.Go(func() error {
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		// Log in and check the namespace and partition before anything
		// reads or writes; an error here is final (the flags are wrong).
		if err := conn.start(gctx, cfg, store, neededPermissions(cfg, cluster.NodeName()), log.Named("consul")); err != nil || gctx.Err() != nil {
			return err
		}
		// Addresses that did not answer at start are checked before use;
		// after a failover, requests go back to the first address.
		g.Go(func() error { return conn.RunServers(gctx) })
		g.Go(func() error {
			reserved.Run(gctx, 30*time.Second, store.ClusterIDs, sup.NotifyAll, log.Named("clusters"))
			return nil
		})
		if cfg.Claim {
			claim, err := claimClusterID(gctx, cfg, kube, conn.Conn, conn.scope, log)
			if consulconn.IsPermissionDenied(err) {
				return conn.permissionError(cfg, "claim the cluster id", err)
			}
			if err != nil || claim == nil {
				return err // refused, or stopping
			}
			defer claim.Release()
			// Kept until Release, not until gctx ends: the last
			// flushes at shutdown still write under the claim.
			g.Go(func() error { return claim.Keep(context.WithoutCancel(gctx)) })
			// Every transaction checks the claim still names this
			// cluster: once another cluster takes it, nothing lands.
			store.SetGuard(claim)
			ready.setClaim(claim)
		}
		if cfg.ToK8s.Enabled || cfg.ToK8s.Import {
			g.Go(func() error {
				return runToK8s(gctx, cfg.ToK8s, toK8s, restCfg, conn.Conn, conn.scope, cluster, recorder, watcher, imports, log.Named("to-k8s"))
			})
		}
		return sup.Run(gctx)
	})
	err = g.Wait()
	log.Info("Stopped")
	return err
}

func kubeConfig(cfg config) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if cfg.Kubeconfig != "" {
		rules.ExplicitPath = cfg.Kubeconfig
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: cfg.KubeContext}
	if cfg.Kubeconfig == "" && cfg.KubeContext == "" {
		if c, err := rest.InClusterConfig(); err == nil {
			return c, nil
		}
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
}

// tuneKubeClient applies the client flags to the Kubernetes config:
// rate limits, protobuf, and gzip only when asked for.
func tuneKubeClient(c *rest.Config, cfg config) {
	c.QPS, c.Burst = float32(cfg.KubeQPS), cfg.KubeBurst
	preferProtobuf(c)
	c.DisableCompression = !cfg.KubeCompression
}

// preferProtobuf makes the Kubernetes client ask for protobuf, with JSON
// as the fallback, unless the config already names a content type:
// every object fleetsync reads or writes is a built-in type, which the
// API server sends as protobuf at a fraction of JSON's cost to encode
// and decode (the lists of a start, of 10,000 Services and their
// EndpointSlices, most of all).
func preferProtobuf(c *rest.Config) {
	if c.ContentType == "" {
		c.ContentType = runtime.ContentTypeProtobuf
	}
	if c.AcceptContentTypes == "" {
		c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
}

// claimClusterID claims the cluster id before anything is written, retrying
// while Kubernetes or Consul cannot be reached. It returns an error only when
// another Kubernetes cluster has the id, and nil, nil when ctx ends first.
func claimClusterID(ctx context.Context, cfg config, kube kubernetes.Interface, conn *consulconn.Conn, scope consul.Scope, log hclog.Logger) (*claim.Claim, error) {
	holder, _ := os.Hostname()
	kubeUID := func(ctx context.Context) (string, error) { return k8s.ClusterUID(ctx, kube) }
	return claim.ClusterIDRetrying(ctx, conn, kubeUID, claim.Options{
		Prefix: cfg.ClaimPrefix, ClusterID: cfg.ClusterID, Holder: holder,
		Takeover: cfg.Takeover, Log: log.Named("claim"), RequestTimeout: cfg.ConsulTimeout, Scope: scope,
	}, log)
}

// shardConfig fills the shard flags' defaults that come from the
// environment: the Lease namespace ($POD_NAMESPACE, else default) and the
// replica id (the host name: the pod name).
func shardConfig(c shard.Config, getenv func(string) string, hostname func() (string, error)) shard.Config {
	if c.Namespace == "" {
		c.Namespace = getenv("POD_NAMESPACE")
	}
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	if c.ReplicaID == "" {
		c.ReplicaID, _ = hostname()
	}
	return c
}
