// Package e2e tests fleetsync end to end: the daemon (a subprocess built from
// cmd/fleetsync) against a real kube-apiserver + etcd and a real Consul agent
// on loopback, started once for the package.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

var (
	kube   *stack.Kube
	consul *stack.Consul
	seq    atomic.Int64
)

// quietConsul turns off coordinate updates, the only Raft applies a dev agent
// makes by itself, so consul_raft_apply counts fleetsync's writes alone.
const quietConsul = "-hcl=disable_coordinates = true"

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped under -short (needs kube-apiserver, etcd and consul)")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	if kube, err = stack.StartKube(ctx, stack.KubeOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer kube.Stop()
	if consul, err = stack.StartConsul(ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul}}); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer consul.Stop()
	defer fixture.RemoveBuild()
	if _, err := fixture.Build(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	fmt.Printf("e2e: kube-apiserver %s at %s, consul %s at %s\n", kube.Version, kube.URL, consul.Version, consul.HTTPAddr)
	return m.Run()
}

// env is one test's namespace and cluster id.
type env struct {
	t       *testing.T
	ns      string
	cluster string
	ctx     context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	n := seq.Add(1)
	name := strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	e := &env{t: t, ns: fmt.Sprintf("%s-%d", strings.Trim(name, "-"), n), cluster: fmt.Sprintf("c%d", n), ctx: t.Context()}
	if err := fixture.Namespace(e.ctx, kube.Client, e.ns); err != nil {
		t.Fatalf("create namespace %s: %v", e.ns, err)
	}
	return e
}

// daemon starts fleetsync for cluster id (default e.cluster) watching e.ns,
// stopped at cleanup.
func (e *env) daemon(args ...string) *fixture.Daemon {
	return e.daemonFor(e.cluster, []string{e.ns}, args...)
}

func (e *env) daemonFor(cluster string, namespaces []string, args ...string) *fixture.Daemon {
	e.t.Helper()
	return e.daemonAt(consul.Addr, cluster, namespaces, args...)
}

// daemonOn is the test's daemon against its own Consul.
func (e *env) daemonOn(own *stack.Consul, args ...string) *fixture.Daemon {
	e.t.Helper()
	return e.daemonAt(own.Addr, e.cluster, []string{e.ns}, args...)
}

// daemonAt starts fleetsync against the Consul at addr; its log tail is
// printed when the test fails, and it is stopped at the test's end.
func (e *env) daemonAt(addr, cluster string, namespaces []string, args ...string) *fixture.Daemon {
	e.t.Helper()
	d, err := fixture.StartDaemon(e.ctx, fixture.DaemonConfig{
		ClusterID: cluster, Kubeconfig: kube.KubeconfigPath, ConsulAddr: addr,
		Namespaces: namespaces, Args: args,
		// client-go's check of every watch-list sync: it lists again and
		// compares, through the informers' transforms, with the cache (a
		// compact EndpointSlice that was no runtime.Object made it panic).
		Env: []string{"KUBE_WATCHLIST_INCONSISTENCY_DETECTOR=true"},
	})
	if err != nil {
		e.t.Fatalf("start fleetsync: %v", err)
	}
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("fleetsync %s log tail:\n%s", cluster, d.LogTail(60))
		}
		d.CloseT(e.t)
	})
	return d
}

func (e *env) node() string { return "k8s-" + e.cluster }

// waitInstances waits until Consul service name on our node holds exactly
// want ("addr:port=status,..." sorted, see fixture.Keys).
func (e *env) waitInstances(name, want string) []fixture.Instance {
	e.t.Helper()
	var got []fixture.Instance
	eventually(e.t, 15*time.Second, "consul service "+name+" on "+e.node(), func() error {
		var err error
		got, err = fixture.Instances(consul.Client, name, e.node())
		if err != nil {
			return err
		}
		if k := fixture.Keys(got, true); k != want {
			return fmt.Errorf("have %q, want %q", k, want)
		}
		return nil
	})
	return got
}

func raftApplies(t *testing.T) float64 {
	t.Helper()
	v, err := consul.RaftApplies()
	if err != nil {
		t.Fatalf("read consul_raft_apply: %v", err)
	}
	return v
}

// catalogTxns counts the transactions Consul applied (consul_fsm_txn_count):
// every catalog write fleetsync makes is one.
func catalogTxns(t *testing.T) float64 {
	t.Helper()
	v, err := consul.CatalogTxns()
	if err != nil {
		t.Fatalf("read consul_fsm_txn_count: %v", err)
	}
	return v
}

// claimWrites counts the session and KV writes Consul applied: those of the
// cluster-id claims.
func claimWrites(t *testing.T) float64 {
	t.Helper()
	var sum float64
	for _, m := range []string{"consul_fsm_session_count", "consul_fsm_kvs_count"} {
		v, err := consul.Counter(m)
		if err != nil {
			t.Fatalf("read %s: %v", m, err)
		}
		sum += v
	}
	return sum
}

var eventually = fixture.Eventually
