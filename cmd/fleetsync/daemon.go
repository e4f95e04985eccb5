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

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/supervisor"
	"github.com/fleetsync/fleetsync/worker"
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
	restCfg.QPS, restCfg.Burst = float32(cfg.KubeQPS), cfg.KubeBurst
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	conn, err := newConsulConn(ctx, cfg, log)
	if err != nil {
		return err
	}
	ccfg, tokens, capi := conn.cfg, conn.tokens, conn.api
	defer conn.logout(log)
	for _, w := range insecureTLSWarnings(ccfg) {
		log.Warn("Insecure Consul connection", "problem", w)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	perWorker, _ := supervisor.ParsePerWorker(cfg.MetricsPerWorker) // validated
	metrics := supervisor.NewMetrics(reg, perWorker)
	store := consul.NewClient(capi, cluster, consul.Options{
		Budget:         consul.NewBudget(cfg.MaxWrites, cfg.WriteBurst, cfg.MaxInflight),
		Observe:        metrics.ObserveTxn,
		ObserveWait:    metrics.ObserveWait,
		RequestTimeout: cfg.ConsulTimeout,
		Scope:          conn.scope,
	})
	health := consul.NewHealth(capi, nil)
	health.Timeout = cfg.ConsulTimeout
	ready := &readiness{sup: nil, health: health, grace: cfg.ConsulGrace}
	recorder := k8s.NewRecorder(kube, "fleetsync", log.Named("events"))
	defer recorder.Shutdown()

	reserved := &supervisor.ReservedTags{}
	sup := supervisor.New(supervisor.Options{
		Selector: supervisor.Selector{DefaultSync: cfg.DefaultSync, Allow: cfg.AllowNamespaces.values, Deny: cfg.DenyNamespaces.values, SkipClusterIP: !cfg.SyncClusterIP},
		Worker: worker.Config{
			Cluster: cluster, DefaultWindow: cfg.Window, ServicePrefix: cfg.ServicePrefix,
			AddNamespaceSuffix: cfg.AddNamespaceSuffix, K8sTag: cfg.K8sTag,
			Terminating: worker.TerminatingPolicy(cfg.Terminating), RegisterNotReady: cfg.RegisterNotReady,
			ReservedTag:  reserved.Lookup,
			NodePortSync: worker.NodePortSyncType(cfg.NodePortSyncType), SyncLoadBalancerEndpoints: cfg.SyncLBEndpoints,
			EnableIngress: cfg.EnableIngress, IngressLoadBalancerIPs: cfg.IngressLBIPs, ConsulK8sMeta: cfg.ConsulK8sMeta,
		},
		Watcher: k8s.NewWatcherWith(kube, k8s.WatcherOptions{
			Resync: cfg.Resync, Nodes: true, Ingresses: cfg.EnableIngress, Log: log.Named("k8s"),
		}),
		Store:             store,
		Metrics:           metrics,
		Reporter:          recorder,
		Log:               log,
		Shards:            cfg.Shards,
		AutoNodes:         cfg.ConsulNodes == 0,
		DrainTimeout:      cfg.ShutdownTimeout,
		ResyncPeriod:      cfg.ResyncPeriod,
		NodeCheckInterval: cfg.NodeCheck,
		// A key nobody writes: Consul answers a read of a missing key
		// with the whole KV table's index (an existing key's is its own).
		StateKey: strings.TrimSuffix(cfg.ClaimPrefix, "/") + "/" + cfg.ClusterID + ".index-probe",
	})
	if err := sup.Selector().Validate(); err != nil {
		return err
	}
	ready.sup = sup
	var shards *supervisor.ShardManager
	if cfg.Shards > 1 {
		sc := shardConfig(cfg, kube, log)
		if err := sc.Validate(); err != nil {
			return err
		}
		shards = supervisor.NewShardManager(sc, sup)
		log.Info("Sharding", "shards", cfg.Shards, "replica", sc.Identity, "lease_namespace", sc.Namespace)
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %w", cfg.HTTPAddr, err)
	}
	srv := &http.Server{Handler: newMux(sup, reg, ready, cfg), ReadHeaderTimeout: 10 * time.Second}
	if consul.BrokenBuild() {
		log.Error("THIS IS A DELIBERATELY BROKEN TEST BUILD (-tags fleetsync_broken_nodelete): it never deletes an instance; never run it against a real Consul")
	}
	log.Info("Starting", "version", version, "http_addr", ln.Addr().String(), "consul", strings.Join(conn.servers.Addresses(), ","), "consul_tls", ccfg.Scheme == "https", "consul_token_file", ccfg.TokenFile,
		"consul_login_auth_method", cfg.LoginAuthMethod, "consul_datacenter", ccfg.Datacenter, "consul_namespace", conn.scope.Namespace, "consul_partition", conn.scope.Partition,
		"gc_percent", mem.GCPercent, "memory_limit_bytes", mem.Limit)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	g.Go(func() error { return tokens.Watch(gctx, 5*time.Second) })
	if shards != nil {
		g.Go(func() error {
			shards.Run(gctx)
			return nil
		})
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
		g.Go(func() error {
			reserved.Run(gctx, 30*time.Second, store.ClusterIDs, sup.NotifyAll, log.Named("clusters"))
			return nil
		})
		if cfg.Claim {
			claim, err := claimClusterID(gctx, cfg, kube, capi, conn.scope, log)
			if consul.IsPermissionDenied(err) {
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

// consulConfig starts from consul/api's DefaultConfig (the CONSUL_* variables)
// and applies the flags that were set.
func consulConfig(cfg config) *consulapi.Config {
	c := consulapi.DefaultConfig()
	if len(cfg.ConsulAddr.values) > 0 {
		c.Address = cfg.ConsulAddr.values[0]
	}
	// The namespace and partition go on each op and read (consul.Scope),
	// not on every request of the client (logins, sessions, status).
	c.Namespace, c.Partition = "", ""
	c.Datacenter = cfg.ConsulDatacenter
	if c.Datacenter == "" {
		c.Datacenter = os.Getenv("CONSUL_DATACENTER")
	}
	if cfg.ConsulToken != "" {
		c.Token = cfg.ConsulToken
	}
	if cfg.ConsulTokenFile != "" {
		c.TokenFile = cfg.ConsulTokenFile
	}
	if cfg.ConsulCACert != "" {
		c.TLSConfig.CAFile = cfg.ConsulCACert
	}
	if cfg.ConsulCert != "" {
		c.TLSConfig.CertFile = cfg.ConsulCert
	}
	if cfg.ConsulKey != "" {
		c.TLSConfig.KeyFile = cfg.ConsulKey
	}
	if cfg.ConsulTLSName != "" {
		c.TLSConfig.Address = cfg.ConsulTLSName
	}
	if cfg.ConsulSSL {
		c.Scheme = "https"
	}
	return c
}

// claimClusterID claims the cluster id before anything is written, retrying
// while Kubernetes or Consul cannot be reached. It returns an error only when
// another Kubernetes cluster has the id, and nil, nil when ctx ends first.
func claimClusterID(ctx context.Context, cfg config, kube kubernetes.Interface, capi *consulapi.Client, scope consul.Scope, log hclog.Logger) (*consul.Claim, error) {
	holder, _ := os.Hostname()
	backoff := 500 * time.Millisecond
	for {
		uid, err := k8s.ClusterUID(ctx, kube)
		if err == nil {
			var claim *consul.Claim
			claim, err = consul.ClaimClusterID(ctx, capi, consul.ClaimOptions{
				Prefix: cfg.ClaimPrefix, ClusterID: cfg.ClusterID, KubeUID: uid, Holder: holder,
				Takeover: cfg.Takeover, Log: log.Named("claim"), RequestTimeout: cfg.ConsulTimeout, Scope: scope,
			})
			if err == nil {
				return claim, nil
			}
			if errors.Is(err, consul.ErrClaimedByOther) || consul.IsPermissionDenied(err) {
				return nil, err // no retry mends these
			}
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		log.Warn("Cannot claim the cluster id yet; retrying", "retry_in", backoff, "error", err)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

func shardConfig(cfg config, kube kubernetes.Interface, log hclog.Logger) supervisor.ShardConfig {
	ns := cfg.LeaseNamespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = "default"
	}
	id := cfg.ReplicaID
	if id == "" {
		id, _ = os.Hostname()
	}
	return supervisor.ShardConfig{Client: kube, Namespace: ns, ClusterID: cfg.ClusterID, Identity: id, Shards: cfg.Shards,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod, Log: log.Named("shards")}
}
