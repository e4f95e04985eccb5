package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/supervisor"
	"github.com/fleetsync/fleetsync/supervisor/shard"
	"github.com/fleetsync/fleetsync/worker"
)

// config is every flag of the daemon.
type config struct {
	ClusterID       string
	Kubeconfig      string
	KubeContext     string
	KubeQPS         float64
	KubeBurst       int
	KubeCompression bool
	ConsulAddr      stringList
	ConsulToken     string
	ConsulTokenFile string
	ConsulCACert    string
	ConsulCert      string
	ConsulKey       string
	ConsulTLSName   string
	ConsulGzip      bool
	ConsulSSL       bool
	ConsulNodes     int

	ConsulDatacenter     string
	ConsulNamespace      string
	ConsulPartition      string
	EnableNamespaces     bool
	MirrorNamespaces     optionalBool // unset: EnableNamespaces (mirroring())
	MirrorPrefix         string
	CrossNSPolicy        string
	LoginAuthMethod      string
	LoginBearerTokenFile string
	LoginMeta            stringList
	LoginDatacenter      string
	LoginNamespace       string
	LoginPartition       string

	DefaultSync        bool
	AllowNamespaces    stringList
	DenyNamespaces     stringList
	ServicePrefix      string
	AddNamespaceSuffix bool
	K8sTag             string
	Terminating        string
	RegisterNotReady   bool
	NodePortSyncType   string
	SyncClusterIP      bool
	SyncLBEndpoints    bool
	EnableIngress      bool
	IngressLBIPs       bool
	ConsulK8sMeta      bool
	StrictAnnotations  bool
	Window             time.Duration
	Resync             time.Duration
	ResyncPeriod       time.Duration
	NodeCheck          time.Duration
	ConsulTimeout      time.Duration

	MaxWrites        float64
	WriteBurst       int
	MaxInflight      int
	MetricsPerWorker string
	ConsulGrace      time.Duration
	EnablePprof      bool

	Shard shard.Config // --shards, --lease-*, --replica-id

	ToK8s toK8sConfig // --to-k8s* (tok8s.go)

	Claim       bool
	ClaimPrefix string
	Takeover    bool

	HTTPAddr        string
	ShutdownTimeout time.Duration
	LogLevel        string
	LogJSON         bool
	Version         bool
}

type stringList struct {
	values []string
	set    bool
}

func (s *stringList) String() string { return strings.Join(s.values, ",") }
func (s *stringList) Set(v string) error {
	if !s.set {
		s.values, s.set = nil, true
	}
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			s.values = append(s.values, p)
		}
	}
	return nil
}

const envPrefix = "FLEETSYNC_"

func (c *config) registerFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.ClusterID, "cluster-id", "", "identity of this Kubernetes cluster in Consul (required; a DNS label)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, else $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&c.KubeContext, "context", "", "kubeconfig context to use")
	fs.Float64Var(&c.KubeQPS, "kube-api-qps", 20, "requests per second to the Kubernetes API (client-side limit; lease renewals and Events count, informers' watches do not)")
	fs.IntVar(&c.KubeBurst, "kube-api-burst", 40, "burst allowed above --kube-api-qps")
	fs.BoolVar(&c.KubeCompression, "kube-api-compression", false, "let the Kubernetes API server gzip its answers (lists and watch streams): less traffic for more CPU on both ends, most of all in a start's lists (off by default)")
	fs.Var(&c.ConsulAddr, "consul-address", "Consul HTTP address, [http(s)://]host:port (default $CONSUL_HTTP_ADDR, else consul-k8s's $CONSUL_ADDRESSES:$CONSUL_HTTP_PORT, else 127.0.0.1:8500); repeatable or comma-separated for several servers: requests go to one and fail over to the next on a connection error, a timeout or a server without a leader; one host name that resolves to several addresses (a headless Service) is expanded and resolved again when a connection fails")
	fs.StringVar(&c.ConsulToken, "consul-token", "", "Consul ACL token (prefer --consul-token-file; default $CONSUL_HTTP_TOKEN, else consul-k8s's $CONSUL_ACL_TOKEN)")
	fs.StringVar(&c.ConsulTokenFile, "consul-token-file", "", "file holding the Consul ACL token (default $CONSUL_HTTP_TOKEN_FILE, else consul-k8s's $CONSUL_ACL_TOKEN_FILE)")
	fs.StringVar(&c.ConsulCACert, "consul-ca-file", "", "CA bundle to verify Consul's TLS certificate (default $CONSUL_CACERT, else consul-k8s's $CONSUL_CACERT_FILE or $CONSUL_CACERT_PEM)")
	fs.StringVar(&c.ConsulCert, "consul-client-cert", "", "client certificate for Consul mTLS (default $CONSUL_CLIENT_CERT)")
	fs.StringVar(&c.ConsulKey, "consul-client-key", "", "client key for Consul mTLS (default $CONSUL_CLIENT_KEY)")
	fs.StringVar(&c.ConsulTLSName, "consul-tls-server-name", "", "server name to verify in Consul's certificate (default $CONSUL_TLS_SERVER_NAME)")
	fs.BoolVar(&c.ConsulSSL, "consul-ssl", false, "talk HTTPS to Consul (default $CONSUL_HTTP_SSL, else consul-k8s's $CONSUL_USE_TLS)")
	fs.BoolVar(&c.ConsulGzip, "consul-compression", false, "ask Consul to gzip its answers (for a Consul across a slow link: compressing costs Consul more CPU than the bytes cost a local network)")
	fs.StringVar(&c.ConsulDatacenter, "consul-datacenter", "", "Consul datacenter of every read and write (default $CONSUL_DATACENTER, else the one the addresses belong to, read at start)")
	fs.StringVar(&c.ConsulNamespace, "consul-namespace", "", "Consul Enterprise namespace of every instance, read and claim key, created at start if missing (with --consul-cross-namespace-acl-policy) (default $CONSUL_NAMESPACE; '' or 'default': none; Consul OSS refuses any other at start); consul-k8s's -consul-destination-namespace")
	fs.StringVar(&c.ConsulPartition, "consul-partition", "", "Consul Enterprise admin partition of every node, instance, read and claim key (default $CONSUL_PARTITION; '' or 'default': none)")
	fs.BoolVar(&c.EnableNamespaces, "enable-namespaces", false, "Consul Enterprise namespaces, as consul-k8s's -enable-namespaces: each instance goes in the Consul namespace named like its Kubernetes namespace (--enable-k8s-namespace-mirroring, on by default with this flag as in the consul chart), or with --enable-k8s-namespace-mirroring=false in --consul-namespace; a missing namespace is created before the first write into it, as consul-k8s does")
	fs.Var(&c.MirrorNamespaces, "enable-k8s-namespace-mirroring", "Consul Enterprise: put each instance in the Consul namespace named like its Kubernetes namespace (with --k8s-namespace-mirroring-prefix), created if missing, as consul-k8s's flag of that name (default: on with --enable-namespaces, as the consul chart's syncCatalog.consulNamespaces.mirroringK8S, else off)")
	fs.StringVar(&c.MirrorPrefix, "k8s-namespace-mirroring-prefix", "", "prefix of the mirrored Consul namespace names (with --enable-k8s-namespace-mirroring)")
	fs.StringVar(&c.CrossNSPolicy, "consul-cross-namespace-acl-policy", "", "ACL policy (in the default namespace) attached as the default policy of every Consul namespace fleetsync creates, as consul-k8s's flag of that name (its chart's: cross-namespace-policy, with manageSystemACLs); creating one needs operator:write, and acl:write with a policy")
	fs.StringVar(&c.LoginAuthMethod, "consul-login-auth-method", "", "log in to Consul with this auth method (a Kubernetes one, e.g. consul-k8s's <release>-consul-k8s-component-auth-method) instead of a static token: the login token is renewed by logging in again when Consul no longer knows it, and logged out on shutdown (default $CONSUL_LOGIN_AUTH_METHOD, unless --consul-token or --consul-token-file is given)")
	fs.StringVar(&c.LoginBearerTokenFile, "consul-login-bearer-token-file", "", "bearer token to log in with, read again before every login (default $CONSUL_LOGIN_BEARER_TOKEN_FILE, else "+conn.DefaultBearerTokenFile+", the pod's ServiceAccount token)")
	fs.Var(&c.LoginMeta, "consul-login-meta", "key=value meta put on the login token (repeatable or comma-separated; e.g. pod=<namespace>/<name>; default $CONSUL_LOGIN_META)")
	fs.StringVar(&c.LoginDatacenter, "consul-login-datacenter", "", "datacenter of the auth method (default $CONSUL_LOGIN_DATACENTER, else --consul-datacenter): a global token from another datacenter's auth method")
	fs.StringVar(&c.LoginNamespace, "consul-login-namespace", "", "Consul Enterprise namespace of the auth method (default $CONSUL_LOGIN_NAMESPACE, else the default namespace)")
	fs.StringVar(&c.LoginPartition, "consul-login-partition", "", "Consul Enterprise admin partition of the auth method (default $CONSUL_LOGIN_PARTITION, else --consul-partition)")

	fs.BoolVar(&c.DefaultSync, "default-sync", false, "sync Services without the "+worker.AnnotationSync+" annotation")
	c.AllowNamespaces = stringList{values: []string{"*"}}
	c.DenyNamespaces = stringList{values: []string{"kube-system"}}
	fs.Var(&c.AllowNamespaces, "allow-namespace", "namespace pattern to sync (repeatable or comma-separated; '*' globs)")
	fs.Var(&c.DenyNamespaces, "deny-namespace", "namespace pattern never to sync (repeatable; deny wins over allow)")
	fs.StringVar(&c.ServicePrefix, "service-prefix", "", "prefix for Consul service names taken from Kubernetes names")
	fs.BoolVar(&c.AddNamespaceSuffix, "add-namespace-suffix", false, "append -<namespace> to Consul service names taken from Kubernetes names")
	fs.StringVar(&c.K8sTag, "k8s-tag", "k8s", "tag added to every synced instance, as consul-k8s does ('' for none)")
	fs.StringVar(&c.Terminating, "terminating", string(worker.TerminatingWarning), "check status of serving+terminating endpoints: warning, critical, or drop (not registered)")
	fs.BoolVar(&c.RegisterNotReady, "register-not-ready", false, "register not-ready endpoints with a critical check instead of leaving them out")
	fs.StringVar(&c.NodePortSyncType, "node-port-sync-type", string(worker.ExternalFirst), "address of a NodePort Service's instances, one per node with endpoints: ExternalFirst (the node's ExternalIP, else its InternalIP), ExternalOnly or InternalOnly; the port is the NodePort (consul-k8s -node-port-sync-type)")
	fs.BoolVar(&c.SyncClusterIP, "sync-clusterip-services", true, "sync ClusterIP Services, headless ones included (consul-k8s -sync-clusterip-services)")
	fs.BoolVar(&c.SyncLBEndpoints, "sync-lb-services-endpoints", false, "register a LoadBalancer Service's endpoints instead of its status.loadBalancer.ingress IPs/hostnames (consul-k8s -sync-lb-services-endpoints)")
	fs.BoolVar(&c.EnableIngress, "enable-ingress", false, "a ClusterIP Service behind a networking.k8s.io/v1 Ingress rule with path / is registered as the rule's host, port 80 (443 when the host is under spec.tls), instead of its endpoints (consul-k8s -enable-ingress)")
	fs.BoolVar(&c.IngressLBIPs, "loadbalancer-ips", false, "with --enable-ingress: register the Ingress's load balancer IP instead of the rule's host (consul-k8s -loadBalancer-ips)")
	fs.BoolVar(&c.ConsulK8sMeta, "consul-k8s-meta", false, "also write consul-k8s's service meta keys (external-k8s-ns, external-k8s-ref-kind, external-k8s-ref-name, external-k8s-node-name, external-k8s-topology-zone, port-<name>) next to fleetsync's k8s-* keys, for consul-template and prepared queries written for consul-k8s")
	fs.BoolVar(&c.StrictAnnotations, "strict-annotations", false, "refuse (an InvalidAnnotation Event, nothing synced) a Consul service name that Consul DNS cannot look up (not a DNS label of at most 63 characters) and a "+worker.AnnotationPort+" name the Service does not have; by default such a Service is synced as consul-k8s syncs it (any name of 1-255 characters; the first port) with a Warning Event")
	fs.DurationVar(&c.Window, "window", time.Second, "per-Service batching window (0: write every change as it comes); annotation "+worker.AnnotationWindow+" overrides")
	fs.DurationVar(&c.Resync, "informer-resync", 0, "Kubernetes informer resync period (0: off)")
	fs.DurationVar(&c.ResyncPeriod, "resync-period", 5*time.Minute, "anti-entropy: every worker re-reads its instances from Consul this often (±10 %; the first pass 0.5 to 1.5 periods after the worker's first sync) and repairs drift (0: off)")
	fs.DurationVar(&c.NodeCheck, "node-check-interval", time.Second, "how often to read the cluster's Consul nodes and their indexes (one or two small requests): a node gone or created again, or an index gone back (Consul restarted empty or restored an older snapshot), makes every worker re-read and repair its Service at once; a node named like ours that is someone else's is reported (0: off)")
	fs.DurationVar(&c.ConsulTimeout, "consul-request-timeout", conn.DefaultRequestTimeout, "deadline of every Consul request: a Consul that accepts connections and never answers costs at most this, and frees the request's slot")

	fs.Float64Var(&c.MaxWrites, "consul-max-writes-per-second", 0, "global budget of Consul transactions per second, shared by all workers (0: unlimited)")
	fs.IntVar(&c.WriteBurst, "consul-write-burst", 10, "burst allowed above --consul-max-writes-per-second")
	fs.IntVar(&c.ConsulNodes, "consul-nodes", 0, "spread the cluster's instances over this many synthetic Consul nodes (k8s-<id>, k8s-<id>.1, ...) by a consistent hash of namespace/name (0: chosen at start, one per 100 selected Services, the nodes in use kept while they hold 50 to 200 on average); Consul's cost of a write grows with the services on its node; a change moves only the Services whose node changed, once, in one transaction per Service")
	fs.IntVar(&c.MaxInflight, "consul-max-inflight", 8, "at most this many Consul transactions in flight at once (0: unlimited)")
	fs.StringVar(&c.MetricsPerWorker, "metrics-per-worker", supervisor.DefaultPerWorker, "per-worker metric series: top-<K> workers (those in trouble first, then the most active since the last scrape), all (one set of series per Service: large at scale), or none; the fleet-wide series are complete either way")
	fs.DurationVar(&c.ConsulGrace, "consul-unreachable-grace", 30*time.Second, "/readyz fails once Consul has not answered for this long")
	fs.BoolVar(&c.EnablePprof, "enable-pprof", false, "serve /debug/pprof/ on the HTTP listener")
	c.Shard.RegisterFlags(fs)
	c.ToK8s.registerFlags(fs)
	fs.BoolVar(&c.Claim, "claim-cluster-id", true, "claim the cluster id in Consul KV (a session-locked key holding the kube-system namespace UID) and refuse to start if another Kubernetes cluster has it")
	fs.StringVar(&c.ClaimPrefix, "claim-prefix", "fleetsync/clusters", "Consul KV prefix of cluster-id claims")
	fs.BoolVar(&c.Takeover, "takeover-cluster-id", false, "take over a cluster id claimed by another Kubernetes cluster that is gone for good (refused while its fleetsync runs)")
	fs.StringVar(&c.HTTPAddr, "http-addr", ":9090", "listen address for /metrics, /healthz, /readyz and /debug")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "time allowed on SIGTERM for pending flushes")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	fs.BoolVar(&c.LogJSON, "log-json", false, "log as JSON")
	fs.BoolVar(&c.Version, "version", false, "print the version and exit")
}

// parse applies FLEETSYNC_<NAME> environment variables, then the args.
func (c *config) parse(fs *flag.FlagSet, args []string, env func(string) string) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := env(name); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s=%q: %w", name, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// A repeatable flag on the command line replaces the variable's list
	// (the command line wins), as it replaces the default.
	fs.VisitAll(func(f *flag.Flag) {
		if l, ok := f.Value.(*stringList); ok {
			l.set = false
		}
	})
	return fs.Parse(args)
}

func (c *config) validate() error {
	if c.ClusterID == "" {
		return errors.New("--cluster-id is required: a DNS label (lowercase letters, digits and '-', 1-63 characters) naming this Kubernetes cluster in Consul")
	}
	if err := ownership.ValidateClusterID(c.ClusterID); err != nil {
		return fmt.Errorf("--cluster-id: %w", err)
	}
	switch worker.TerminatingPolicy(c.Terminating) {
	case worker.TerminatingWarning, worker.TerminatingCritical, worker.TerminatingDrop:
	default:
		return fmt.Errorf("--terminating=%q: must be warning, critical or drop", c.Terminating)
	}
	switch worker.NodePortSyncType(c.NodePortSyncType) {
	case worker.ExternalFirst, worker.ExternalOnly, worker.InternalOnly:
	default:
		return fmt.Errorf("--node-port-sync-type=%q: must be ExternalFirst, ExternalOnly or InternalOnly", c.NodePortSyncType)
	}
	if c.IngressLBIPs && !c.EnableIngress {
		return errors.New("--loadbalancer-ips needs --enable-ingress")
	}
	if c.ConsulNodes < 0 || c.ConsulNodes > ownership.MaxNodes {
		return fmt.Errorf("--consul-nodes=%d: must be 0 (chosen at start) or between 1 and %d", c.ConsulNodes, ownership.MaxNodes)
	}
	if c.KubeQPS <= 0 || c.KubeBurst < 1 {
		return fmt.Errorf("--kube-api-qps=%g and --kube-api-burst=%d: must be positive", c.KubeQPS, c.KubeBurst)
	}
	if c.Window < 0 {
		return fmt.Errorf("--window=%s: must not be negative", c.Window)
	}
	if err := c.Shard.Validate(); err != nil {
		return err
	}
	if err := c.ToK8s.validate(); err != nil {
		return err
	}
	if c.ConsulTimeout <= 0 {
		return fmt.Errorf("--consul-request-timeout=%s: must be positive", c.ConsulTimeout)
	}
	if c.ResyncPeriod < 0 || c.NodeCheck < 0 {
		return fmt.Errorf("--resync-period and --node-check-interval must not be negative")
	}
	if c.ShutdownTimeout < 0 {
		return fmt.Errorf("--shutdown-timeout=%s: must not be negative", c.ShutdownTimeout)
	}
	if _, err := supervisor.ParsePerWorker(c.MetricsPerWorker); err != nil {
		return fmt.Errorf("--metrics-per-worker=%w", err)
	}
	if c.MaxWrites < 0 || c.MaxInflight < 0 || c.WriteBurst < 1 {
		return fmt.Errorf("--consul-max-writes-per-second, --consul-max-inflight must not be negative and --consul-write-burst must be at least 1")
	}
	if c.ConsulGrace <= 0 {
		return fmt.Errorf("--consul-unreachable-grace=%s: must be positive", c.ConsulGrace)
	}
	if _, err := c.loginMeta(); err != nil {
		return err
	}
	if c.LoginAuthMethod != "" && (c.ConsulToken != "" || c.ConsulTokenFile != "") {
		return errors.New("--consul-login-auth-method and --consul-token/--consul-token-file: choose one (the login token replaces the static one)")
	}
	if err := c.validateNamespaces(); err != nil {
		return err
	}
	if c.K8sTag != "" && c.K8sTag == c.ClusterID {
		return fmt.Errorf("--k8s-tag=%q: must differ from the cluster id", c.K8sTag)
	}
	return nil
}

// loginMeta parses --consul-login-meta.
func (c *config) loginMeta() (map[string]string, error) {
	if len(c.LoginMeta.values) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(c.LoginMeta.values))
	for _, kv := range c.LoginMeta.values {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("--consul-login-meta=%q: want key=value", kv)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}
