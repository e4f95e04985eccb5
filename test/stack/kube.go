package stack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// KubeOptions tune StartKube. The zero value is fine.
type KubeOptions struct {
	// BinDir holds etcd and kube-apiserver; default BinDir().
	BinDir string
	// StartTimeout bounds the whole start, retries included;
	// default DefaultStartTimeout (the context's deadline also applies).
	StartTimeout time.Duration
	// ExtraAPIServerArgs are appended to kube-apiserver's flags
	// (a repeated flag overrides the default).
	ExtraAPIServerArgs []string
}

// Kube is a running etcd + kube-apiserver on 127.0.0.1. Nothing else runs: no
// controller-manager, scheduler or kubelet, so Services get no Endpoints or
// EndpointSlices unless a test writes them (which is what fleetsync's tests
// want), and the apiserver's own endpoint reconciler is off.
type Kube struct {
	// Config is an admin rest.Config (bearer token in group system:masters,
	// the serving cert verified against the test CA).
	Config *rest.Config
	// Client is a clientset built from Config.
	Client kubernetes.Interface
	// KubeconfigPath is a kubeconfig file with the same admin credentials,
	// for subprocesses (the fleetsync daemon, kubectl).
	KubeconfigPath string
	// Version is the apiserver's gitVersion from /version, e.g. "v1.37.2".
	Version string
	// URL is the apiserver's base URL, https://127.0.0.1:<port>.
	URL string
	// AdminToken is the bearer token of the admin user.
	AdminToken string
	// CAPEM is the CA that signed the apiserver's serving certificate.
	CAPEM []byte
	// EtcdURL is etcd's client URL (gRPC only); EtcdHTTPURL serves its
	// HTTP endpoints (/health, the JSON gateway).
	EtcdURL, EtcdHTTPURL string
	// Dir is the temp dir with etcd's data, certs, keys and logs; Stop
	// removes it.
	Dir string
	// Etcd and APIServer are the two children (logs: Process.LogPath).
	Etcd, APIServer *Process

	stopOnce sync.Once
	stopErr  error
}

// KubeT starts a Kube for t and stops it in t.Cleanup; when t has failed by
// then, the log tails of both servers go to t.Log. It skips t under -short
// and fails t when the start fails.
func KubeT(t testing.TB) *Kube {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real kube-apiserver and etcd; skipped under -short")
	}
	start := time.Now()
	k, err := StartKube(context.Background(), KubeOptions{})
	if err != nil {
		t.Fatalf("starting the kube stack: %v", err)
	}
	t.Logf("kube-apiserver %s at %s ready in %s (kubeconfig %s)", k.Version, k.URL, time.Since(start).Round(time.Millisecond), k.KubeconfigPath)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("etcd log tail:\n%s", indent(k.Etcd.LogTail(20)))
			t.Logf("kube-apiserver log tail:\n%s", indent(k.APIServer.LogTail(40)))
		}
		if err := k.Stop(); err != nil {
			t.Errorf("stopping the kube stack: %v", err)
		}
	})
	return k
}

// StartKube starts etcd and kube-apiserver on free loopback ports in a new
// temp dir and returns once /readyz answers 200 and the default namespace
// exists. The caller must call Stop. If a picked port was taken meanwhile the
// whole start is retried with new ports; any other failure returns an error
// holding the failed server's log tail.
func StartKube(ctx context.Context, opts KubeOptions) (*Kube, error) {
	etcdBin, err := binPath(opts.BinDir, EtcdBin)
	if err != nil {
		return nil, err
	}
	apiBin, err := binPath(opts.BinDir, APIServerBin)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withStartTimeout(ctx, opts.StartTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		k, err := startKubeOnce(ctx, etcdBin, apiBin, opts)
		if err == nil {
			return k, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == startAttempts || ctx.Err() != nil {
			return nil, fmt.Errorf("kube stack (attempt %d): %w", attempt, err)
		}
	}
}

func startKubeOnce(ctx context.Context, etcdBin, apiBin string, opts KubeOptions) (_ *Kube, err error) {
	dir, err := makeTempDir("kube")
	if err != nil {
		return nil, err
	}
	k := &Kube{Dir: dir}
	defer func() {
		if err != nil {
			_ = k.Stop()
		}
	}()
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	clientPort, peerPort, apiPort, httpPort := ports[0], ports[1], ports[2], ports[3]

	// etcd first: it boots while we generate keys. gRPC and HTTP on
	// separate ports, so that gRPC is served by etcd's own gRPC server
	// (on one port it goes through net/http's HTTP/2, which allows 250
	// streams per connection).
	k.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(clientPort)
	k.EtcdHTTPURL = "http://127.0.0.1:" + strconv.Itoa(httpPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	k.Etcd, err = StartProcess(ctx, "etcd", etcdBin, []string{
		"--name=fleetsync-test",
		"--data-dir=" + filepath.Join(dir, "etcd-data"),
		"--listen-client-urls=" + k.EtcdURL,
		"--advertise-client-urls=" + k.EtcdURL,
		"--listen-client-http-urls=" + k.EtcdHTTPURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=fleetsync-test=" + peerURL,
		"--initial-cluster-state=new",
		"--initial-cluster-token=fleetsync-test-" + randomToken()[:12],
		"--unsafe-no-fsync=true", // throwaway data: no fsync, much faster on slow disks
		"--log-level=warn",
	}, nil, dir)
	if err != nil {
		return nil, err
	}

	cert, err := newServingCert()
	if err != nil {
		return nil, fmt.Errorf("serving cert: %w", err)
	}
	saKey, err := newServiceAccountKey()
	if err != nil {
		return nil, fmt.Errorf("service account key: %w", err)
	}
	k.CAPEM = cert.caPEM
	k.AdminToken = randomToken()
	k.URL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	files := map[string][]byte{
		"ca.crt":              cert.caPEM,
		"apiserver.crt":       cert.certPEM,
		"apiserver.key":       cert.keyPEM,
		"service-account.key": saKey,
		"tokens.csv":          []byte(k.AdminToken + `,fleetsync-admin,fleetsync-admin,"system:masters"` + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}

	etcdClient := &http.Client{Timeout: 2 * time.Second}
	defer etcdClient.CloseIdleConnections()
	if err := waitFor(ctx, "etcd /health", []*Process{k.Etcd}, func(ctx context.Context) (bool, error) {
		code, _, err := httpGet(ctx, etcdClient, k.EtcdHTTPURL+"/health", "")
		return code == http.StatusOK, err
	}); err != nil {
		return nil, err
	}

	args := []string{
		"--etcd-servers=" + k.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file=" + filepath.Join(dir, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "apiserver.key"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + k.URL,
		"--service-account-key-file=" + filepath.Join(dir, "service-account.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "service-account.key"),
		"--service-cluster-ip-range=10.96.0.0/16", // room for the thousands of Services tests and benchmarks create
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		// No controller-manager runs, so no default ServiceAccount would
		// ever appear: let Pods be created without one.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	k.APIServer, err = StartProcess(ctx, "kube-apiserver", apiBin, append(args, opts.ExtraAPIServerArgs...), nil, dir)
	if err != nil {
		return nil, err
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cert.caPEM)
	apiClient := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer apiClient.CloseIdleConnections()
	if err := waitFor(ctx, "kube-apiserver /readyz", []*Process{k.APIServer, k.Etcd}, func(ctx context.Context) (bool, error) {
		code, body, err := httpGet(ctx, apiClient, k.URL+"/readyz", k.AdminToken)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/readyz: %d %s", code, lastLines(body, 5))
		}
		return code == http.StatusOK, err
	}); err != nil {
		return nil, err
	}

	k.Config = &rest.Config{
		Host:            k.URL,
		BearerToken:     k.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: cert.caPEM},
		QPS:             1000,
		Burst:           2000,
		UserAgent:       "fleetsync-test-stack",
	}
	cs, err := kubernetes.NewForConfig(k.Config)
	if err != nil {
		return nil, err
	}
	k.Client = cs
	// The bootstrap controller creates the default namespace right after
	// start; tests may rely on it.
	if err := waitFor(ctx, "namespace default", []*Process{k.APIServer, k.Etcd}, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, err
		}
		return err == nil, err
	}); err != nil {
		return nil, err
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver /version: %w", err)
	}
	k.Version = v.GitVersion

	k.KubeconfigPath = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(k.KubeconfigPath, []byte(k.kubeconfig()), 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *Kube) kubeconfig() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fleetsync-test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: fleetsync-admin
  user:
    token: %s
contexts:
- name: fleetsync-test
  context:
    cluster: fleetsync-test
    user: fleetsync-admin
current-context: fleetsync-test
`, k.URL, base64.StdEncoding.EncodeToString(k.CAPEM), k.AdminToken)
}

// Stop stops kube-apiserver, then etcd (SIGTERM, a grace period, SIGKILL),
// and removes Dir. It is idempotent.
func (k *Kube) Stop() error {
	k.stopOnce.Do(func() {
		var errs []error
		if k.APIServer != nil {
			errs = append(errs, k.APIServer.Stop())
		}
		if k.Etcd != nil {
			errs = append(errs, k.Etcd.Stop())
		}
		if k.Dir != "" {
			// Keep the tails readable after the dir is gone.
			for _, p := range []*Process{k.APIServer, k.Etcd} {
				if p != nil {
					p.cacheTail()
				}
			}
			errs = append(errs, os.RemoveAll(k.Dir))
		}
		k.stopErr = errors.Join(errs...)
	})
	return k.stopErr
}

// RestartAPIServer stops kube-apiserver (SIGTERM) and starts it again with
// the same flags, port and etcd, then waits for /readyz: clients see their
// watches break and relist, as in a rolling apiserver update.
func (k *Kube) RestartAPIServer(ctx context.Context) error {
	if err := k.StopAPIServer(); err != nil {
		return err
	}
	return k.StartAPIServer(ctx)
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after the
// grace period); etcd keeps running. StartAPIServer brings it back.
func (k *Kube) StopAPIServer() error {
	if err := k.APIServer.Stop(); err != nil && !isExit(err) {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	return nil
}

// StartAPIServer starts the stopped kube-apiserver again with the same
// flags, port and etcd, and waits for its /readyz.
func (k *Kube) StartAPIServer(ctx context.Context) error {
	old := k.APIServer
	p, err := StartProcess(ctx, "kube-apiserver-restarted", old.Bin, old.Args, nil, k.Dir)
	if err != nil {
		return err
	}
	k.APIServer = p
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.CAPEM)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer c.CloseIdleConnections()
	return waitFor(ctx, "kube-apiserver /readyz after restart", []*Process{p, k.Etcd}, func(ctx context.Context) (bool, error) {
		code, body, err := httpGet(ctx, c, k.URL+"/readyz", k.AdminToken)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/readyz: %d %s", code, lastLines(body, 5))
		}
		return code == http.StatusOK, err
	})
}

func isExit(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}
