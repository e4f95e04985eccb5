// Command demo shows fleetsync working end to end on this machine: it starts
// a real kube-apiserver (+ etcd) and a Consul dev agent on loopback, runs the
// fleetsync daemon against them, writes a few sample Services and
// EndpointSlices, steps through everyday changes and prints the Consul
// catalog after each one. Everything it starts is stopped on exit, on error
// and on Ctrl-C. Run it with `make demo` (or `go run ./test/demo` once
// `make tools` has built the servers).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

const (
	clusterID = "demo"
	node      = "k8s-" + clusterID // fleetsync's synthetic Consul node
	ns        = "shop"
	ann       = "consul.hashicorp.com/"
	waitLimit = 20 * time.Second // bounds every wait for a change to show up
)

var web = map[string]int32{"http": 8080}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }() // a second Ctrl-C kills at once (the servers die with us)
	if err := run(ctx); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "\ndemo interrupted")
		} else {
			fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		}
		os.Exit(1)
	}
}

// demo holds what run started.
type demo struct {
	ctx     context.Context
	kube    *stack.Kube
	consul  *stack.Consul
	daemon  *fixture.Daemon
	bin     string              // the fleetsync binary fixture.Build made
	applies float64             // Consul's Raft applies before fleetsync started
	catalog map[string]instance // as printed last, by instance ID
}

func run(ctx context.Context) (err error) {
	d := &demo{ctx: ctx}
	defer func() { d.teardown(err != nil && ctx.Err() == nil) }()
	for _, phase := range []func() error{d.startStack, d.startDaemon, d.createSamples, d.runSteps,
		d.showEvent, d.showWorkers, d.showRaftApplies} {
		if err := phase(); err != nil {
			return err
		}
	}
	return nil
}

// startStack starts etcd + kube-apiserver and Consul side by side.
func (d *demo) startStack() error {
	bin, err := stack.BinDir()
	if err != nil {
		return err
	}
	heading("Starting kube-apiserver + etcd and a Consul dev agent (binaries from %s)", bin)
	start := time.Now()
	kubeErr := make(chan error, 1)
	go func() {
		var err error
		d.kube, err = stack.StartKube(d.ctx, stack.KubeOptions{})
		kubeErr <- err
	}()
	// disable_coordinates turns off the dev agent's only writes of its own,
	// so the Raft applies counted at the end are fleetsync's.
	var cerr error
	d.consul, cerr = stack.StartConsul(d.ctx, stack.ConsulOptions{ExtraArgs: []string{"-hcl=disable_coordinates = true"}})
	if err := errors.Join(<-kubeErr, cerr); err != nil {
		return err
	}
	fmt.Printf("  kube-apiserver %s at %s\n", d.kube.Version, d.kube.URL)
	fmt.Printf("  consul %s at %s\n", d.consul.Version, d.consul.HTTPAddr)
	fmt.Printf("  ready in %s\n", since(start))
	return nil
}

// startDaemon builds and starts fleetsync and shows its /readyz.
func (d *demo) startDaemon() (err error) {
	heading("Starting fleetsync (cluster id %q)", clusterID)
	start := time.Now()
	if d.bin, err = fixture.Build(); err != nil {
		return err
	}
	fmt.Printf("  built cmd/fleetsync in %s\n", since(start))
	if d.applies, err = d.consul.RaftApplies(); err != nil {
		return err
	}
	start = time.Now()
	d.daemon, err = fixture.StartDaemon(d.ctx, fixture.DaemonConfig{
		ClusterID: clusterID, Kubeconfig: d.kube.KubeconfigPath, ConsulAddr: d.consul.Addr,
		Namespaces: []string{"*"}, Args: []string{"--deny-namespace=kube-system", "--default-sync=false"},
	})
	if err != nil {
		return err
	}
	var flags []string
	for _, a := range d.daemon.Args {
		if !strings.HasPrefix(a, "--kubeconfig=") {
			flags = append(flags, a)
		}
	}
	fmt.Printf("  fleetsync %s\n", strings.Join(flags, " "))
	code, body, err := d.daemon.Get(d.ctx, "/readyz", "")
	if err != nil {
		return err
	}
	fmt.Printf("  GET /readyz -> %d %s (ready %s after start)\n", code, strings.TrimSpace(body), since(start))
	fmt.Printf("  log: %s\n", d.daemon.LogPath)
	return nil
}

// createSamples writes namespace shop with four Services and their slices.
func (d *demo) createSamples() error {
	heading("Creating namespace %q with four Services and their EndpointSlices", ns)
	c := d.kube.Client
	if err := fixture.Namespace(d.ctx, c, ns); err != nil {
		return err
	}
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	samples := []struct {
		caption string
		svc     *corev1.Service
		slices  []*discoveryv1.EndpointSlice
	}{
		{"checkout   opted in, service-tags v1,public, service-meta-team payments; 3 pods",
			fixture.Service(ns, "checkout", map[string]string{ann + "service-sync": "true",
				ann + "service-tags": "v1,public", ann + "service-meta-team": "payments"}, web),
			[]*discoveryv1.EndpointSlice{checkoutSlice(3, nil)}},
		{"inventory  opted in; three slices: 2 + 1 IPv4 endpoints, 2 IPv6 endpoints",
			fixture.Service(ns, "inventory", map[string]string{ann + "service-sync": "true"}, web),
			[]*discoveryv1.EndpointSlice{
				fixture.Slice(ns, "inventory", "inventory-a", v4, web, fixture.IPs(2, 0, 2)),
				fixture.Slice(ns, "inventory", "inventory-b", v4, web, fixture.IPs(2, 2, 1)),
				fixture.Slice(ns, "inventory", "inventory-v6", v6, web, []fixture.EP{{IP: "fd00::2:1"}, {IP: "fd00::2:2"}})}},
		{`legacy     opted out (service-sync: "false"); 1 pod`,
			fixture.Service(ns, "legacy", map[string]string{ann + "service-sync": "false"}, web),
			[]*discoveryv1.EndpointSlice{fixture.Slice(ns, "legacy", "legacy-1", v4, web, fixture.IPs(3, 0, 1))}},
		{"broken     opted in, but service-port: 70000 is no port number; 1 pod",
			fixture.Service(ns, "broken", map[string]string{ann + "service-sync": "true", ann + "service-port": "70000"}, web),
			[]*discoveryv1.EndpointSlice{fixture.Slice(ns, "broken", "broken-1", v4, web, fixture.IPs(4, 0, 1))}},
	}
	start, applies := time.Now(), d.raftApplies()
	for _, s := range samples {
		fmt.Printf("  %s\n", s.caption)
		if err := fixture.ApplyService(d.ctx, c, s.svc); err != nil {
			return err
		}
		for _, sl := range s.slices {
			if err := fixture.ApplySlice(d.ctx, c, sl); err != nil {
				return err
			}
		}
	}
	if err := d.waitConsul(watch{"checkout", "10.1.0.1:8080=passing,10.1.0.2:8080=passing,10.1.0.3:8080=passing"},
		watch{"inventory", "10.2.0.1:8080=passing,10.2.0.2:8080=passing,10.2.0.3:8080=passing,[fd00::2:1]:8080=passing,[fd00::2:2]:8080=passing"}); err != nil {
		return err
	}
	for _, name := range []string{"legacy", "broken"} {
		if ins, err := d.instances(name); err != nil || len(ins) != 0 {
			return fmt.Errorf("%s should not be in Consul: %d instances (%v)", name, len(ins), err)
		}
	}
	if err := d.printResult(start, applies); err != nil {
		return err
	}
	ins, err := d.instances("checkout")
	if err != nil {
		return err
	}
	fmt.Printf("  meta of %s:\n    %s\n", ins[0].ID, formatMeta(ins[0].Meta))
	fmt.Println("  legacy (opted out) and broken (bad annotation) are not in Consul. inventory's second and")
	fmt.Println("  third slices came less than 1s (its batching window) after its first write: one more write.")
	return nil
}

// checkoutSlice is checkout's slice with pods 10.1.0.1..n; edit, if set,
// changes the endpoints first.
func checkoutSlice(n int, edit func(eps []fixture.EP)) *discoveryv1.EndpointSlice {
	eps := fixture.IPs(1, 0, n)
	if edit != nil {
		edit(eps)
	}
	return fixture.Slice(ns, "checkout", "checkout-1", discoveryv1.AddressTypeIPv4, web, eps)
}

// step is one change to Kubernetes Service svc and what Consul must show
// after it.
type step struct {
	caption, svc string
	change       func(ctx context.Context) error
	want         []watch
}

func (d *demo) steps() []step {
	c := d.kube.Client
	apply := func(s *discoveryv1.EndpointSlice) func(context.Context) error {
		return func(ctx context.Context) error { return fixture.ApplySlice(ctx, c, s) }
	}
	annotate := func(key, value string) func(context.Context) error {
		return func(ctx context.Context) error {
			svc, err := c.CoreV1().Services(ns).Get(ctx, "checkout", metav1.GetOptions{})
			if err != nil {
				return err
			}
			svc.Annotations[key] = value
			_, err = c.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
			return err
		}
	}
	notReady := func(eps []fixture.EP) { eps[1].NotReady = true }
	terminating := func(eps []fixture.EP) { notReady(eps); eps[2].Terminating = true }
	const four = "10.1.0.1:8080=passing,10.1.0.3:8080=%s,10.1.0.4:8080=passing,10.1.0.5:8080=passing"
	return []step{
		{"Scale checkout from 3 to 5 pods", "checkout", apply(checkoutSlice(5, nil)),
			[]watch{{"checkout", "10.1.0.1:8080=passing,10.1.0.2:8080=passing,10.1.0.3:8080=passing,10.1.0.4:8080=passing,10.1.0.5:8080=passing"}}},
		{"Pod 10.1.0.2 fails its readiness probe (ready=false): it leaves Consul", "checkout",
			apply(checkoutSlice(5, notReady)), []watch{{"checkout", fmt.Sprintf(four, "passing")}}},
		{"Pod 10.1.0.3 is terminating but still serving: its check turns warning", "checkout",
			apply(checkoutSlice(5, terminating)), []watch{{"checkout", fmt.Sprintf(four, "warning")}}},
		{"Change checkout's service-tags annotation from v1,public to v2,public", "checkout",
			annotate(ann+"service-tags", "v2,public"), []watch{{"checkout", fmt.Sprintf(four, "warning") + " tags=k8s,v2,public,demo"}}},
		{"Rename: annotate checkout with service-name: payments-api", "checkout",
			annotate(ann+"service-name", "payments-api"), []watch{{"payments-api", fmt.Sprintf(four, "warning")}, {"checkout", ""}}},
		{"Delete Service inventory", "inventory", func(ctx context.Context) error {
			return c.CoreV1().Services(ns).Delete(ctx, "inventory", metav1.DeleteOptions{})
		}, []watch{{"inventory", ""}}},
	}
}

func (d *demo) runSteps() error {
	fmt.Println("\nEach step starts once the Service's last write is older than its batching window")
	fmt.Println("(default 1s), so that fleetsync writes the change at once.")
	for i, s := range d.steps() {
		if err := d.runStep(i+1, s); err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, s.caption, err)
		}
	}
	return nil
}

func (d *demo) runStep(n int, s step) error {
	heading("Step %d: %s", n, s.caption)
	if err := d.settle(s.svc); err != nil {
		return err
	}
	start, applies := time.Now(), d.raftApplies()
	if err := s.change(d.ctx); err != nil {
		return err
	}
	if err := d.waitConsul(s.want...); err != nil {
		return err
	}
	return d.printResult(start, applies)
}

// printResult prints how long the change took to show up in Consul, how
// many Raft applies (Consul writes) it took, and the catalog.
func (d *demo) printResult(start time.Time, applies float64) error {
	fmt.Printf("  -> in Consul after %s (Raft applies: %.0f)\n", since(start), d.raftApplies()-applies)
	return d.printCatalog()
}

// raftApplies is Consul's running count of Raft applies (NaN if unreadable).
func (d *demo) raftApplies() float64 {
	n, err := d.consul.RaftApplies()
	if err != nil {
		return math.NaN()
	}
	return n
}

// settle waits until the worker of svc is idle and its last flush is older
// than its window, so the next change is an isolated one.
func (d *demo) settle(svc string) error {
	return d.poll("worker "+ns+"/"+svc+" idle", func() (bool, error) {
		var st struct {
			State, Window string
			LastFlush     time.Time
		}
		code, body, err := d.daemon.Get(d.ctx, "/debug/workers/"+ns+"/"+svc, "")
		if err == nil && code == 200 {
			err = json.Unmarshal([]byte(body), &st)
		}
		window, _ := time.ParseDuration(st.Window)
		return err == nil && st.State == "idle" && time.Since(st.LastFlush) > window, err
	})
}

// poll calls done every 50ms until it reports true, failing after waitLimit.
func (d *demo) poll(what string, done func() (bool, error)) error {
	deadline := time.Now().Add(waitLimit)
	for {
		ok, err := done()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not true after %s (last error: %v)", what, waitLimit, err)
		}
		select {
		case <-d.ctx.Done():
			return d.ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// showEvent prints the Warning Event fleetsync recorded on Service broken.
func (d *demo) showEvent() error {
	const name = "broken"
	heading("The Kubernetes Event on Service %s/%s", ns, name)
	return d.poll("Warning event on "+name, func() (bool, error) {
		list, err := d.kube.Client.CoreV1().Events(ns).List(d.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Type == corev1.EventTypeWarning {
				fmt.Printf("  %s %s (from %s, count %d):\n    %s\n", e.Type, e.Reason, e.Source.Component, e.Count, e.Message)
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events, none a Warning", len(list.Items))
	})
}

func (d *demo) showWorkers() error {
	heading("GET /debug/workers (Accept: text/plain)")
	code, body, err := d.daemon.Get(d.ctx, "/debug/workers", "text/plain")
	if err == nil && code != 200 {
		err = fmt.Errorf("/debug/workers: HTTP %d: %s", code, body)
	}
	if err != nil {
		return err
	}
	fmt.Println(indent(body, "  "))
	return nil
}

// showRaftApplies prints how many Consul writes fleetsync made, then counts
// those of a 5-second idle period.
func (d *demo) showRaftApplies() error {
	heading("Consul writes (Raft applies, consul_raft_apply)")
	now, err := d.consul.RaftApplies()
	if err != nil {
		return err
	}
	fmt.Printf("  everything above, since fleetsync started: %.0f\n", now-d.applies)
	select {
	case <-d.ctx.Done():
		return d.ctx.Err()
	case <-time.After(5 * time.Second):
	}
	after, err := d.consul.RaftApplies()
	if err != nil {
		return err
	}
	verdict := "expected 0: no write without a change"
	if after != now {
		verdict = "UNEXPECTED: expected 0, steady state should cost no writes"
	}
	fmt.Printf("  5 seconds with nothing changing:           %.0f  (%s)\n", after-now, verdict)
	return nil
}

// teardown stops the daemon, Consul and Kubernetes. After a failure it
// prints the daemon's log tail and keeps the log.
func (d *demo) teardown(failed bool) {
	heading("Tearing down")
	if d.daemon != nil {
		if failed {
			fmt.Printf("  fleetsync log tail:\n%s\n", indent(d.daemon.LogTail(30), "    | "))
		}
		report("fleetsync", d.daemon.Stop())
		if failed {
			fmt.Printf("  fleetsync log kept: %s\n", d.daemon.LogPath)
		} else {
			_ = os.RemoveAll(d.daemon.Dir)
		}
	}
	if d.consul != nil {
		report("consul", d.consul.Stop())
	}
	if d.kube != nil {
		report("kube-apiserver and etcd", d.kube.Stop())
	}
	if d.bin != "" {
		_ = os.RemoveAll(filepath.Dir(d.bin)) // fixture.Build's temp dir
	}
}

func report(what string, err error) {
	if err != nil {
		fmt.Printf("  stopping %s: %v\n", what, err)
		return
	}
	fmt.Printf("  stopped %s\n", what)
}

func heading(format string, args ...any) { fmt.Printf("\n== "+format+"\n", args...) }

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}
