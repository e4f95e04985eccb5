package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// vmInstance registers one instance of name on its own Consul node (a VM)
// with one check in status.
func vmInstance(t *testing.T, node, nodeAddr, name, id, addr string, port int, status string) {
	t.Helper()
	_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{
		Node: node, Address: nodeAddr, SkipNodeUpdate: true,
		Service: &consulapi.AgentService{ID: id, Service: name, Address: addr, Port: port},
		Checks:  consulapi.HealthChecks{{Node: node, CheckID: "check-" + id, Name: "check", Status: status, ServiceID: id}},
	}, nil)
	if err != nil {
		t.Fatalf("register %s/%s: %v", node, id, err)
	}
}

// sliceView is "address=ready/serving/terminating" per endpoint, sorted,
// per slice name: "name[family]: ...".
func sliceView(ctx context.Context, t *testing.T, ns, svc string) (string, error) {
	list, err := kube.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		return "", err
	}
	var parts []string
	for _, s := range list.Items {
		if s.Labels["endpointslice.kubernetes.io/managed-by"] != "to-k8s.fleetsync.io" {
			continue
		}
		parts = append(parts, sliceLine(s))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; "), nil
}

// sliceLine is one slice of sliceView: "name[family:port]: endpoints".
func sliceLine(s discoveryv1.EndpointSlice) string {
	var eps []string
	for _, e := range s.Endpoints {
		c := e.Conditions
		eps = append(eps, fmt.Sprintf("%s=%v/%v/%v", e.Addresses[0], *c.Ready, *c.Serving, *c.Terminating))
	}
	sort.Strings(eps)
	port := int32(0)
	if len(s.Ports) == 1 && s.Ports[0].Port != nil {
		port = *s.Ports[0].Port
	}
	return fmt.Sprintf("%s[%s:%d]: %s", s.Name, s.AddressType, port, strings.Join(eps, " "))
}

func (e *env) waitSlices(svc, want string) {
	e.t.Helper()
	eventually(e.t, 20*time.Second, "slices of "+svc, func() error {
		got, err := sliceView(e.ctx, e.t, e.ns, svc)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("have %q, want %q", got, want)
		}
		return nil
	})
}

// k8sWrites counts every change of a Service or EndpointSlice in ns from
// now on (a watch: each event is one write).
func (e *env) k8sWrites() *atomic.Int64 {
	e.t.Helper()
	var n atomic.Int64
	ctx, cancel := context.WithCancel(e.ctx)
	e.t.Cleanup(cancel)
	// Watch from the current resourceVersion: a watch without one starts
	// with an ADDED event per existing object.
	slices, err := kube.Client.DiscoveryV1().EndpointSlices(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	svcs, err := kube.Client.CoreV1().Services(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, w := range []func() (watch.Interface, error){
		func() (watch.Interface, error) {
			return kube.Client.DiscoveryV1().EndpointSlices(e.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: slices.ResourceVersion})
		},
		func() (watch.Interface, error) {
			return kube.Client.CoreV1().Services(e.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: svcs.ResourceVersion})
		},
	} {
		wi, err := w()
		if err != nil {
			e.t.Fatalf("watch: %v", err)
		}
		go func() {
			defer wi.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-wi.ResultChan():
					if !ok {
						return
					}
					if ev.Type != watch.Bookmark {
						n.Add(1)
					}
				}
			}
		}()
	}
	return &n
}

// quiet waits d and fails if anything was written meanwhile, on either
// side. Consul's side counts catalog transactions, fleetsync's only way of
// writing the catalog: Consul's own Raft applies (coordinate updates,
// sessions of other tests' daemons) are not fleetsync's writes.
func (e *env) quiet(what string, d time.Duration) {
	e.t.Helper()
	writes := e.k8sWrites()
	before := catalogTxns(e.t)
	time.Sleep(d) // measuring a quiet interval: nothing to await
	if n, txns := writes.Load(), catalogTxns(e.t)-before; n != 0 || txns != 0 {
		e.t.Fatalf("%s: %d Kubernetes writes and %v catalog transactions in %s, want 0", what, n, txns, d)
	}
}

// TestToK8sMirror: mirror mode makes a selectorless Service with the mark
// and EndpointSlices per address family following the health table; a
// check change is one slice update; a user's label survives fleetsync's
// updates; a foreign Service of a mirrored name is left alone; a restart
// (SIGTERM or kill -9) over an unchanged Consul writes nothing; a name gone from Consul has its
// objects deleted.
func TestToK8sMirror(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "m"
	web, taken := p+"-web", p+"-taken"
	vmInstance(t, p+"-vm1", "10.77.0.1", web, "w1", "", 8080, "passing")
	vmInstance(t, p+"-vm2", "10.77.0.2", web, "w2", "10.77.1.2", 8080, "warning")
	vmInstance(t, p+"-vm3", "10.77.0.3", web, "w3", "", 8080, "critical")
	vmInstance(t, p+"-vm4", "10.77.0.4", web, "w4", "fd00::4", 8080, "passing")
	vmInstance(t, p+"-vm5", "10.77.0.5", web, "w5", "db.example.com", 8080, "passing") // a hostname: skipped
	vmInstance(t, p+"-vm6", "10.77.0.6", taken, "t1", "", 9000, "passing")
	foreign := fixture.Service(e.ns, taken, nil, map[string]int32{"http": 80})
	if _, err := kube.Client.CoreV1().Services(e.ns).Create(e.ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := e.daemon("--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*")
	e.waitSlices(web, web+"-4-8080-0[IPv4:8080]: 10.77.0.1=true/true/false 10.77.0.3=false/false/false 10.77.1.2=true/true/false; "+
		web+"-6-8080-0[IPv6:8080]: fd00::4=true/true/false")
	svc, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, web, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Labels["endpointslice.kubernetes.io/managed-by"] != "to-k8s.fleetsync.io" || svc.Labels["fleetsync.io/cluster"] != e.cluster ||
		svc.Spec.Selector != nil || svc.Spec.Type != corev1.ServiceTypeClusterIP || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8080 ||
		svc.Annotations["fleetsync.io/consul-service"] != web {
		t.Fatalf("mirrored Service: labels %v, annotations %v, spec %+v", svc.Labels, svc.Annotations, svc.Spec)
	}
	// The foreign Service of a mirrored name: untouched, reported.
	got, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, taken, metav1.GetOptions{})
	if err != nil || got.ResourceVersion == "" || len(got.Labels) != 0 {
		t.Fatalf("foreign Service %v: %+v", err, got)
	}
	eventually(t, 10*time.Second, "NameTaken event", func() error {
		evs, err := kube.Client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=NameTaken"})
		if err != nil || len(evs.Items) == 0 {
			return fmt.Errorf("no NameTaken event (%v)", err)
		}
		return nil
	})
	if s, _ := sliceView(e.ctx, t, e.ns, taken); s != "" {
		t.Fatalf("slices for the foreign Service: %s", s)
	}
	e.quiet("steady state", 3*time.Second)

	// A check turning passing: one slice write.
	writes := e.k8sWrites()
	vmInstance(t, p+"-vm3", "10.77.0.3", web, "w3", "", 8080, "passing")
	e.waitSlices(web, web+"-4-8080-0[IPv4:8080]: 10.77.0.1=true/true/false 10.77.0.3=true/true/false 10.77.1.2=true/true/false; "+
		web+"-6-8080-0[IPv6:8080]: fd00::4=true/true/false")
	if n := writes.Load(); n != 1 {
		t.Errorf("%d Kubernetes writes for one check change, want 1", n)
	}

	// A user's label survives fleetsync's server-side apply (a lower port
	// changes the Service's port).
	svc, _ = kube.Client.CoreV1().Services(e.ns).Get(e.ctx, web, metav1.GetOptions{})
	svc.Labels["team"] = "payments"
	if _, err := kube.Client.CoreV1().Services(e.ns).Update(e.ctx, svc, metav1.UpdateOptions{FieldManager: "kubectl-label"}); err != nil {
		t.Fatal(err)
	}
	vmInstance(t, p+"-vm7", "10.77.0.7", web, "w7", "", 7070, "passing")
	eventually(t, 20*time.Second, "port 7070 and the user's label", func() error {
		svc, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, web, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if svc.Spec.Ports[0].Port != 7070 || svc.Labels["team"] != "payments" {
			return fmt.Errorf("port %d, labels %v", svc.Spec.Ports[0].Port, svc.Labels)
		}
		return nil
	})
	e.waitSlices(web, web+"-4-7070-0[IPv4:7070]: 10.77.0.7=true/true/false; "+
		web+"-4-8080-0[IPv4:8080]: 10.77.0.1=true/true/false 10.77.0.3=true/true/false 10.77.1.2=true/true/false; "+
		web+"-6-8080-0[IPv6:8080]: fd00::4=true/true/false")

	// A restart (SIGTERM, then kill -9) over an unchanged Consul writes nothing.
	for _, kill := range []bool{false, true} {
		writes = e.k8sWrites()
		before := catalogTxns(t) // a restart claims the cluster id again (session and KV writes): not a catalog write
		if err := d.Restart(e.ctx, kill); err != nil {
			t.Fatal(err)
		}
		if err := d.WaitReady(e.ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		e.quiet(fmt.Sprintf("after the restart (kill %v)", kill), 3*time.Second)
		if n, a := writes.Load(), catalogTxns(t)-before; n != 0 || a != 0 {
			t.Fatalf("restart (kill %v): %d Kubernetes writes, %v catalog transactions; want 0", kill, n, a)
		}
	}

	// The name gone from Consul: its slices and Service are deleted.
	for i, id := range []string{"w1", "w2", "w3", "w4", "w5", "w7"} {
		node := fmt.Sprintf("%s-vm%d", p, []int{1, 2, 3, 4, 5, 7}[i])
		if _, err := consul.Client.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: node, ServiceID: id}, nil); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 20*time.Second, "mirrored Service deleted", func() error {
		if s, _ := sliceView(e.ctx, t, e.ns, web); s != "" {
			return fmt.Errorf("slices left: %s", s)
		}
		if _, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, web, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("service %s still there", web)
		}
		return nil
	})
	if got, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, taken, metav1.GetOptions{}); err != nil || len(got.Labels) != 0 {
		t.Fatalf("foreign Service after all: %v %+v", err, got)
	}
}

// TestToK8sLoopGuard: both directions on, --default-sync=true, no k8s tag
// and this cluster named in --to-k8s-include-clusters (so only the
// per-instance node check guards): the mixed service's
// mirror holds exactly its VM instance, never this cluster's own pods; no
// mirrored Service goes back to Consul; another Kubernetes cluster's
// instance is left out; and in steady state neither side is written.
func TestToK8sLoopGuard(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "l"
	app, vmOnly := p+"-app", p+"-vm"
	ports := map[string]int32{"http": 8080}
	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, app, nil, ports)))
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, app, app+"-1", discoveryv1.AddressTypeIPv4, ports,
		[]fixture.EP{{IP: "10.88.0.1"}, {IP: "10.88.0.2"}})))
	vmInstance(t, p+"-vm1", "10.78.0.1", app, "a1", "", 8080, "passing")
	vmInstance(t, p+"-vm2", "10.78.0.2", vmOnly, "v1", "", 9090, "passing")
	// Another Kubernetes cluster's instance of the same name, on its marked node.
	_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{
		Node: "k8s-zz" + p, Address: "127.0.0.1", NodeMeta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "zz" + p},
		Service: &consulapi.AgentService{ID: "zz1", Service: vmOnly, Address: "10.66.0.1", Port: 9090,
			Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "zz" + p}},
	}, nil)
	must(t, err)

	// --to-k8s-include-clusters naming this cluster itself: its own
	// instances still never come back (they are on its marked node).
	e.daemon("--default-sync=true", "--k8s-tag=", "--to-k8s-include-clusters="+e.cluster, "--to-k8s", "--k8s-write-namespace="+e.ns, "--k8s-service-prefix=m-", "--to-k8s-allow="+p+"-*")
	e.waitInstances(app, "10.88.0.1:8080=passing,10.88.0.2:8080=passing")
	e.waitSlices("m-"+app, "m-"+app+"-4-8080-0[IPv4:8080]: 10.78.0.1=true/true/false")
	e.waitSlices("m-"+vmOnly, "m-"+vmOnly+"-4-9090-0[IPv4:9090]: 10.78.0.2=true/true/false")
	e.quiet("steady state with both directions", 3*time.Second)
	for _, name := range []string{"m-" + app, "m-" + vmOnly} {
		entries, _, err := consul.Client.Catalog().Service(name, "", nil)
		must(t, err)
		if len(entries) != 0 {
			t.Errorf("consul service %s (made from a to-k8s Service) has %d instances", name, len(entries))
		}
	}
	entries, _, err := consul.Client.Catalog().Service(app, "", nil)
	must(t, err)
	var got []string
	for _, en := range entries {
		got = append(got, en.Node+"/"+en.ServiceAddress)
	}
	sort.Strings(got)
	want := []string{"k8s-" + e.cluster + "/10.88.0.1", "k8s-" + e.cluster + "/10.88.0.2", p + "-vm1/"}
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("consul service %s: %v, want %v", app, got, want)
	}
}

// TestToK8sImport: import mode fills a selectorless Service annotated
// fleetsync.io/consul-service with slices grouped by instance port, owned by
// the Service and named by its port; a Service with a selector gets an
// InvalidAnnotation Event and no slices; removing the annotation removes
// the slices and leaves the Service.
func TestToK8sImport(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "i"
	db, bad, consulName := p+"-db", p+"-bad", p+"-postgres"
	vmInstance(t, p+"-vm1", "10.79.0.1", consulName, "d1", "", 5432, "passing")
	vmInstance(t, p+"-vm2", "10.79.0.2", consulName, "d2", "", 5433, "passing")
	// Service maintenance mode, as `consul maint -service` records it.
	_, err := consul.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: p + "-vm2", Address: "10.79.0.2", SkipNodeUpdate: true,
		Check: &consulapi.AgentCheck{Node: p + "-vm2", CheckID: "_service_maintenance:d2", Name: "Service Maintenance Mode", Status: "critical", ServiceID: "d2"}}, nil)
	must(t, err)
	ann := map[string]string{"fleetsync.io/consul-service": consulName}
	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, db, ann, map[string]int32{"pg": 5432})))
	withSelector := fixture.Service(e.ns, bad, ann, map[string]int32{"pg": 5432})
	withSelector.Spec.Selector = map[string]string{"app": "db"}
	must(t, fixture.ApplyService(e.ctx, kube.Client, withSelector))
	e.daemon("--to-k8s-import")
	e.waitSlices(db, db+"-4-5432-0[IPv4:5432]: 10.79.0.1=true/true/false; "+db+"-4-5433-0[IPv4:5433]: 10.79.0.2=false/false/true")
	svc, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, db, metav1.GetOptions{})
	must(t, err)
	list, err := kube.Client.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + db})
	must(t, err)
	for _, s := range list.Items {
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != svc.UID || *s.Ports[0].Name != "pg" || s.Labels["fleetsync.io/cluster"] != e.cluster {
			t.Errorf("slice %s: owners %v, port %q, labels %v", s.Name, s.OwnerReferences, *s.Ports[0].Name, s.Labels)
		}
	}
	if len(svc.Labels) != 0 {
		t.Errorf("the user's Service got labels %v", svc.Labels)
	}
	eventually(t, 10*time.Second, "InvalidAnnotation event", func() error {
		evs, err := kube.Client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=InvalidAnnotation,involvedObject.name=" + bad})
		if err != nil || len(evs.Items) == 0 {
			return fmt.Errorf("no InvalidAnnotation event for %s (%v)", bad, err)
		}
		return nil
	})
	if s, _ := sliceView(e.ctx, t, e.ns, bad); s != "" {
		t.Fatalf("slices for the Service with a selector: %s", s)
	}
	e.quiet("import steady state", 2*time.Second)

	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, db, nil, map[string]int32{"pg": 5432})))
	e.waitSlices(db, "")
	if _, err := kube.Client.CoreV1().Services(e.ns).Get(e.ctx, db, metav1.GetOptions{}); err != nil {
		t.Fatalf("the user's Service: %v", err)
	}
}
