// Package smoke is the end-to-end smoke test of the real test stack: one
// kube-apiserver (+ etcd) and one Consul agent, started once in TestMain and
// shared by every test here. It checks the versions of what runs, that
// Services and EndpointSlices flow through a shared informer, that a /v1/txn
// catalog write lands and that RaftApplies counts it.
//
// Under -short every test skips and no server is started.
//
// Process hygiene can be checked by hand with FLEETSYNC_SMOKE_FAIL (see
// TestHygieneProbe): after a failing or timed-out run no etcd,
// kube-apiserver or consul may be left running.
package smoke

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/fleetsync/fleetsync/test/stack"
)

const (
	wantKubeVersion   = "v1.37.2"
	wantConsulVersion = "1.14.11"
)

// The shared stack; nil under -short.
var (
	kube   *stack.Kube
	consul *stack.Consul
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := run(m) // the stack is stopped when run returns
	if code == 0 && !testing.Short() {
		// Nothing of ours may outlive the tests: informers, watches and
		// HTTP connections are all closed by now.
		if err := goleak.Find(
			goleak.IgnoreTopFunction(stack.SpawnerFunction),
			goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"), // started by klog's init
		); err != nil {
			fmt.Fprintln(os.Stderr, "smoke: goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// run starts the stack, runs the tests and always stops the stack before
// returning, whatever the tests did. (If the process dies instead, e.g. on
// -timeout, the kernel kills the servers: see package stack.)
func run(m *testing.M) int {
	if testing.Short() {
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	type result struct {
		err  error
		took time.Duration
	}
	kubeDone, consulDone := make(chan result, 1), make(chan result, 1)
	go func() {
		start := time.Now()
		k, err := stack.StartKube(ctx, stack.KubeOptions{})
		kube = k
		kubeDone <- result{err, time.Since(start)}
	}()
	go func() {
		start := time.Now()
		c, err := stack.StartConsul(ctx, stack.ConsulOptions{})
		consul = c
		consulDone <- result{err, time.Since(start)}
	}()
	kr, cr := <-kubeDone, <-consulDone
	defer func() {
		if consul != nil {
			if err := consul.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "smoke: stopping consul:", err)
			}
		}
		if kube != nil {
			if err := kube.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "smoke: stopping the kube stack:", err)
			}
		}
	}()
	if kr.err != nil || cr.err != nil {
		fmt.Fprintf(os.Stderr, "smoke: starting the stack failed\n  kube: %v\n  consul: %v\n", kr.err, cr.err)
		return 1
	}
	fmt.Printf("smoke: kube-apiserver %s at %s ready in %s; consul %s at %s ready in %s\n",
		kube.Version, kube.URL, kr.took.Round(time.Millisecond), consul.Version, consul.HTTPAddr, cr.took.Round(time.Millisecond))

	code := m.Run()
	if code != 0 {
		quote := func(s string) string { return "    | " + strings.ReplaceAll(s, "\n", "\n    | ") }
		fmt.Fprintf(os.Stderr, "smoke: kube-apiserver log tail:\n%s\nsmoke: consul log tail:\n%s\n",
			quote(kube.APIServer.LogTail(20)), quote(consul.Agent().LogTail(20)))
	}
	return code
}

func need(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: needs kube-apiserver, etcd and consul; skipped under -short")
	}
}

func TestVersions(t *testing.T) {
	need(t)
	v, err := kube.Client.Discovery().ServerVersion() // GET /version
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver /version: gitVersion=%s goVersion=%s platform=%s", v.GitVersion, v.GoVersion, v.Platform)
	if !strings.Contains(v.GitVersion, wantKubeVersion) {
		t.Errorf("kube-apiserver gitVersion = %q; want %s (stale tool cache? run `make tools`)", v.GitVersion, wantKubeVersion)
	}

	self, err := consul.Client.Agent().Self() // GET /v1/agent/self
	if err != nil {
		t.Fatal(err)
	}
	cv, _ := self["Config"]["Version"].(string)
	t.Logf("consul /v1/agent/self: Config.Version=%s", cv)
	if cv != wantConsulVersion {
		t.Errorf("consul version = %q; want %s", cv, wantConsulVersion)
	}
}

func TestServiceAndEndpointSliceThroughInformer(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := kube.Client
	ns := "smoke-" + strings.ToLower(fmt.Sprint(time.Now().UnixNano()%1e6))
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	svcEvents := make(chan string, 16)
	sliceEvents := make(chan *discoveryv1.EndpointSlice, 16)
	if _, err := factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { svcEvents <- "add " + obj.(*corev1.Service).Name },
	}); err != nil {
		t.Fatal(err)
	}
	onSlice := func(obj any) { sliceEvents <- obj.(*discoveryv1.EndpointSlice) }
	if _, err := factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onSlice,
		UpdateFunc: func(_, obj any) { onSlice(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer factory.Shutdown() // waits for the informers' goroutines
	defer close(stop)
	factory.Start(stop)
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("informer for %v did not sync", typ)
		}
	}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{ // no selector: endpoints are ours to write
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "web-1",
			Namespace: ns,
			Labels:    map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.1.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.1.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}
	created, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	select {
	case ev := <-svcEvents:
		if ev != "add web" {
			t.Fatalf("service event %q; want add web", ev)
		}
	case <-ctx.Done():
		t.Fatal("the Service never reached the informer")
	}
	got := waitSlice(ctx, t, sliceEvents, func(s *discoveryv1.EndpointSlice) bool { return s.ResourceVersion == created.ResourceVersion })
	if got.Labels[discoveryv1.LabelServiceName] != "web" || len(got.Endpoints) != 2 || *got.Ports[0].Port != 8080 {
		t.Fatalf("informer saw %+v", got)
	}

	// An update (the second endpoint turns ready) arrives too.
	created.Endpoints[1].Conditions.Ready = ptr.To(true)
	updated, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got = waitSlice(ctx, t, sliceEvents, func(s *discoveryv1.EndpointSlice) bool { return s.ResourceVersion == updated.ResourceVersion })
	if !*got.Endpoints[1].Conditions.Ready {
		t.Fatalf("update not seen: %+v", got.Endpoints)
	}
	// The lister (the informer's cache) holds the same.
	listed, err := factory.Discovery().V1().EndpointSlices().Lister().EndpointSlices(ns).Get("web-1")
	if err != nil || listed.ResourceVersion != updated.ResourceVersion {
		t.Fatalf("lister: %v, %v", listed, err)
	}
}

func waitSlice(ctx context.Context, t *testing.T, ch <-chan *discoveryv1.EndpointSlice, match func(*discoveryv1.EndpointSlice) bool) *discoveryv1.EndpointSlice {
	t.Helper()
	for {
		select {
		case s := <-ch:
			if match(s) {
				return s
			}
		case <-ctx.Done():
			t.Fatal("the EndpointSlice event never reached the informer")
		}
	}
}

// writeInstance registers one service instance on a synthetic node in one
// /v1/txn: the node op first, then the service op (a service op needs its
// node to exist).
func writeInstance(t *testing.T, node, service, id string) {
	t.Helper()
	ops := consulapi.TxnOps{
		{Node: &consulapi.NodeTxnOp{Verb: consulapi.NodeSet, Node: consulapi.Node{
			Node:    node,
			Address: "127.0.0.1",
			Meta:    map[string]string{"external-source": "kubernetes", "k8s-cluster": "smoke"},
		}}},
		{Service: &consulapi.ServiceTxnOp{Verb: consulapi.ServiceSet, Node: node, Service: consulapi.AgentService{
			ID:      id,
			Service: service,
			Address: "10.1.0.1",
			Port:    8080,
			Tags:    []string{"smoke"},
			Meta:    map[string]string{"external-source": "kubernetes", "k8s-cluster": "smoke"},
		}}},
	}
	ok, resp, _, err := consul.Client.Txn().Txn(ops, nil)
	if err != nil {
		t.Fatalf("txn: %v", err)
	}
	if !ok {
		t.Fatalf("txn rolled back: %+v", resp.Errors)
	}
	if len(resp.Results) != 2 {
		t.Fatalf("txn returned %d results; want 2", len(resp.Results))
	}
}

func TestConsulTxnRoundTrip(t *testing.T) {
	need(t)
	writeInstance(t, "k8s-smoke", "smoke-web", "smoke-web-10.1.0.1-8080")
	svcs, _, err := consul.Client.Catalog().Service("smoke-web", "", &consulapi.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) != 1 {
		t.Fatalf("catalog has %d smoke-web instances; want 1", len(svcs))
	}
	s := svcs[0]
	if s.Node != "k8s-smoke" || s.ServiceID != "smoke-web-10.1.0.1-8080" || s.ServiceAddress != "10.1.0.1" || s.ServicePort != 8080 ||
		s.ServiceMeta["k8s-cluster"] != "smoke" || s.NodeMeta["external-source"] != "kubernetes" {
		t.Fatalf("catalog entry %+v", s)
	}
}

func TestRaftAppliesCountsTxn(t *testing.T) {
	need(t)
	before, err := consul.RaftApplies()
	if err != nil {
		t.Fatal(err)
	}
	writeInstance(t, "k8s-smoke-raft", "smoke-raft", "smoke-raft-1")
	after, err := consul.RaftApplies()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("consul_raft_apply %v -> %v across one /v1/txn", before, after)
	if after < before+1 {
		t.Fatalf("consul_raft_apply went %v -> %v across one /v1/txn; want +1 or more", before, after)
	}
}

// TestHygieneProbe is for checking process hygiene by hand; it is skipped
// unless FLEETSYNC_SMOKE_FAIL is set:
//
//	FLEETSYNC_SMOKE_FAIL=fatal go test -count=1 ./test/smoke   # a failing test
//	FLEETSYNC_SMOKE_FAIL=hang go test -count=1 -timeout 20s ./test/smoke   # killed by -timeout
//	ps -eo pid,cmd | grep -E 'etcd|kube-apiserver|consul agent' | grep -v grep   # must print nothing
func TestHygieneProbe(t *testing.T) {
	need(t)
	switch mode := os.Getenv("FLEETSYNC_SMOKE_FAIL"); mode {
	case "":
		t.Skip("set FLEETSYNC_SMOKE_FAIL=fatal|hang to check that a failed or killed run leaves no servers behind")
	case "fatal":
		t.Fatal("deliberate failure (FLEETSYNC_SMOKE_FAIL=fatal)")
	case "hang":
		t.Log("sleeping until go test's -timeout kills the test binary (FLEETSYNC_SMOKE_FAIL=hang)")
		time.Sleep(time.Hour)
	default:
		t.Fatalf("FLEETSYNC_SMOKE_FAIL=%q: want fatal or hang", mode)
	}
}
