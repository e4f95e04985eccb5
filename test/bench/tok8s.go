package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/fleetsync/fleetsync/test/fixture"
)

const (
	tok8sNS     = "tok8s"     // where --to-k8s mirrors
	tok8sRawNS  = "tok8s-raw" // the limit: the same objects, written by a raw client
	tok8sPrefix = "vm-"       // Consul names of the mirrored services
	tok8sNodes  = 50          // VM nodes the instances spread over
	tok8sBig    = "vm-big"    // the one large service
	// The daemon's defaults (--to-k8s-qps, --to-k8s-burst, --to-k8s-window):
	// the limit client gets the same budget.
	tok8sQPS    = 20
	tok8sBurst  = 40
	tok8sWindow = time.Second
)

func tok8sName(i int) string { return fmt.Sprintf("%s%05d", tok8sPrefix, i) }

// tok8sAddr is instance j of service i: unique, IPv4.
func tok8sAddr(i, j int) string {
	return fmt.Sprintf("10.%d.%d.%d", 100+i/250, i%250, j+1)
}

// tok8sBigAddr is instance j of the large service.
func tok8sBigAddr(j int) string { return fmt.Sprintf("10.%d.%d.%d", 200+j/62500, j/250%250, j%250+1) }

// toK8s measures the Consul -> Kubernetes direction with default flags
// (--to-k8s, mirror mode): the first mirror against a raw client with the
// same write budget, idle writes on both sides, isolated changes to the
// slice a kube-proxy sees, a burst of flips of one service, and one
// service of many instances.
func (b *bench) toK8s() error {
	n, m := b.opts.tok8sServices, b.opts.tok8sInstances
	fmt.Printf("\n== to-k8s: %d Consul services x %d instances mirrored into Kubernetes (--to-k8s, default flags)\n", n, m)
	b.stopDaemon()
	for _, ns := range []string{tok8sNS, tok8sRawNS} {
		if err := fixture.Namespace(b.ctx, b.kc, ns); err != nil {
			return err
		}
	}
	start := time.Now()
	if err := b.registerVMs(n, m); err != nil {
		return err
	}
	b.logf("registered %d services x %d instances on %d nodes in Consul in %s", n, m, tok8sNodes, since(start))

	raw, err := b.tok8sLimit(n, m)
	if err != nil {
		return err
	}
	w, err := startSliceWatch(b.ctx, b.kc, tok8sNS)
	if err != nil {
		return err
	}
	defer w.stop()
	d, err := b.startDaemon("fleetsync-tok8s", []string{tok8sNS}, "--to-k8s", "--k8s-write-namespace="+tok8sNS)
	if err != nil {
		return err
	}
	t0 := b.started
	if err := b.untilMirrored(w, n, m, 10*time.Minute); err != nil {
		return err
	}
	first := time.Since(t0)
	objects := 2 * n
	b.res.add("to-k8s", "first mirror: Services + EndpointSlices", float64(objects), "objects", fmt.Sprintf("%d x %d", n, m))
	b.res.add("to-k8s", "first mirror: daemon start -> every slice complete", secs(first), "s", fmt.Sprintf("%.0f objects/s", float64(objects)/first.Seconds()))
	b.res.add("to-k8s", "first mirror: raw client, same objects, same QPS/burst", secs(raw), "s",
		fmt.Sprintf("client-go, QPS %d burst %d, 8 in flight", tok8sQPS, tok8sBurst))
	b.res.add("to-k8s", "first mirror: raw client / fleetsync", round2(raw.Seconds()/first.Seconds()), "ratio", "target >= 0.8")

	if err := b.tok8sIdle("to-k8s", d, b.opts.tok8sIdle, b.opts.tok8sIdle.String()); err != nil {
		return err
	}
	if err := b.tok8sLatency("to-k8s", w, n); err != nil {
		return err
	}
	if err := b.tok8sAddLatency("to-k8s", w, n, m); err != nil {
		return err
	}
	if err := b.tok8sFlips(w); err != nil {
		return err
	}
	if err := b.tok8sLarge(w); err != nil {
		return err
	}
	return b.tok8sReplicas(n)
}

// registerVMs puts n services x m instances, each with a passing check, on
// tok8sNodes nodes that are not fleetsync's, 4 transactions in flight.
func (b *bench) registerVMs(n, m int) error {
	var nodes, ops consulapi.TxnOps
	for k := range tok8sNodes {
		nodes = append(nodes, &consulapi.TxnOp{Node: &consulapi.NodeTxnOp{Verb: consulapi.NodeSet,
			Node: consulapi.Node{Node: fmt.Sprintf("vm-node-%02d", k), Address: fmt.Sprintf("10.99.0.%d", k+1)}}})
	}
	// The nodes first: a service op on a node not yet registered is refused.
	if err := b.sendOps(nodes); err != nil {
		return err
	}
	for i := range n {
		for j := range m {
			ops = append(ops, vmOps(tok8sName(i), fmt.Sprintf("%s-%d", tok8sName(i), j), tok8sAddr(i, j), (i*m+j)%tok8sNodes, consulapi.HealthPassing)...)
		}
	}
	return b.sendOps(ops)
}

// vmOps registers (or re-registers) one instance and its check.
func vmOps(name, id, addr string, node int, status string) consulapi.TxnOps {
	nodeName := fmt.Sprintf("vm-node-%02d", node)
	return consulapi.TxnOps{
		{Service: &consulapi.ServiceTxnOp{Verb: consulapi.ServiceSet, Node: nodeName,
			Service: consulapi.AgentService{ID: id, Service: name, Address: addr, Port: 8080}}},
		{Check: &consulapi.CheckTxnOp{Verb: consulapi.CheckSet, Check: consulapi.HealthCheck{
			Node: nodeName, CheckID: "check-" + id, Name: "check", Status: status, ServiceID: id, ServiceName: name}}},
	}
}

// sendOps sends ops in transactions of 64, 4 at a time.
func (b *bench) sendOps(ops consulapi.TxnOps) error {
	const per = 64
	var chunks []consulapi.TxnOps
	for i := 0; i < len(ops); i += per {
		chunks = append(chunks, ops[i:min(i+per, len(ops))])
	}
	return parallelN(b.ctx, 4, 0, len(chunks), func(ctx context.Context, i int) error {
		ok, resp, _, err := b.consul.Client.Txn().Txn(chunks[i], (&consulapi.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("consul txn: %w", err)
		}
		if !ok {
			var why []string
			for _, e := range resp.Errors {
				why = append(why, fmt.Sprintf("op %d: %s", e.OpIndex, e.What))
			}
			return fmt.Errorf("consul txn refused: %s", strings.Join(why, "; "))
		}
		return nil
	})
}

// untilMirrored waits until every one of n services has its slices with m
// ready endpoints.
func (b *bench) untilMirrored(w *sliceWatch, n, m int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	err := w.until(ctx, func(s map[string]*discoveryv1.EndpointSlice) bool {
		per := map[string]int{}
		for _, sl := range s {
			for _, e := range sl.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					per[sl.Labels[discoveryv1.LabelServiceName]]++
				}
			}
		}
		for i := range n {
			if per[tok8sName(i)] != m {
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("not every service mirrored after %s: %w", timeout, err)
	}
	return nil
}

// tok8sLimit creates the objects fleetsync makes for n x m (a selectorless
// Service and one EndpointSlice per service) with a raw client-go client
// of the daemon's write budget, 8 creates in flight, and returns how long
// that took.
func (b *bench) tok8sLimit(n, m int) (time.Duration, error) {
	cfg := rest.CopyConfig(b.kube.Config)
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(tok8sQPS, tok8sBurst)
	cfg.UserAgent = "fleetsync-bench-limit"
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	err = parallelN(b.ctx, 8, 0, n, func(ctx context.Context, i int) error {
		name := tok8sName(i)
		if _, err := kc.CoreV1().Services(tok8sRawNS).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "default", Port: 8080}}},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		eps := make([]discoveryv1.Endpoint, m)
		ready := true
		for j := range eps {
			eps[j] = discoveryv1.Endpoint{Addresses: []string{tok8sAddr(i, j)}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
		}
		port, pname := int32(8080), "default"
		_, err := kc.DiscoveryV1().EndpointSlices(tok8sRawNS).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-ipv4", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
			Ports: []discoveryv1.EndpointPort{{Name: &pname, Port: &port}},
		}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("limit client: %w", err)
	}
	took := time.Since(start)
	b.logf("limit: %d Services + %d EndpointSlices by a raw client (QPS %d, burst %d) in %s", n, n, tok8sQPS, tok8sBurst, took.Round(time.Millisecond))
	return took, nil
}

// tok8sIdle measures an idle stretch of scenario sc after the first mirror:
// API writes (the API server's count), Raft applies and Consul's HTTP
// requests over idle, which about describes in the notes.
func (b *bench) tok8sIdle(sc string, d *fixture.Daemon, idle time.Duration, about string) error {
	// Let the last writes of the mirror land first.
	if _, err := b.quietApplies(2 * time.Second); err != nil {
		return err
	}
	if err := sleep(b.ctx, 2*tok8sWindow); err != nil {
		return err
	}
	kw0, err := b.kubeWrites()
	if err != nil {
		return err
	}
	ap0, err := b.applies()
	if err != nil {
		return err
	}
	rq0, err := b.consulRequests()
	if err != nil {
		return err
	}
	b.logf("idle for %s", idle)
	if err := sleep(b.ctx, idle); err != nil { // measuring a quiet interval: nothing to await
		return err
	}
	kw1, err := b.kubeWrites()
	if err != nil {
		return err
	}
	ap1, err := b.applies()
	if err != nil {
		return err
	}
	rq1, err := b.consulRequests()
	if err != nil {
		return err
	}
	if d.Exited() {
		return fmt.Errorf("fleetsync exited while idle:\n%s", indent(d.LogTail(30)))
	}
	reads := rq1.minus(rq0)
	blocking, polling, err := b.healthWatches(d)
	if err != nil {
		return err
	}
	b.res.add(sc, "health queries blocking / polling", blocking, "queries",
		fmt.Sprintf("%.0f polling (fleetsync_tok8s_health_watches; past --to-k8s-max-watches a service is read every --to-k8s-poll-interval)", polling))
	b.res.add(sc, "idle: Kubernetes API writes", kw1-kw0, "writes", fmt.Sprintf("%s; Services, EndpointSlices, Events (apiserver_request_total); target 0", about))
	b.res.add(sc, "idle: Consul Raft applies", ap1-ap0, "applies", fmt.Sprintf("%s; target 0", about))
	b.res.add(sc, "idle: Consul HTTP requests", round2(reads.total()/idle.Seconds()), "req/s", fmt.Sprintf("%s; %s", about, reads))
	return nil
}

// setCheck sets the check of instance j of service i (on its node).
func (b *bench) setCheck(name string, i, j, m int, status string) error {
	_, _, _, err := b.consul.Client.Txn().Txn(vmOps(name, fmt.Sprintf("%s-%d", name, j), tok8sAddr(i, j), (i*m+j)%tok8sNodes, status)[1:],
		(&consulapi.QueryOptions{}).WithContext(b.ctx))
	return err
}

// tok8sLatency flips one instance's check per sample (passing <-> critical),
// a different service each time, and times the Consul write returning ->
// the informer seeing the slice's ready condition change: figures of
// scenario sc. Every check starts passing.
func (b *bench) tok8sLatency(sc string, w *sliceWatch, n int) error {
	samples, m := b.opts.latencySamples, b.opts.tok8sInstances
	critical := map[int]bool{}
	last := map[int]time.Time{}
	var lat []float64
	for k := range samples {
		i := k % n
		if t, ok := last[i]; ok {
			if err := sleep(b.ctx, tok8sWindow+500*time.Millisecond-time.Since(t)); err != nil {
				return err
			}
		}
		critical[i] = !critical[i]
		status := consulapi.HealthPassing
		if critical[i] {
			status = consulapi.HealthCritical
		}
		name, addr := tok8sName(i), tok8sAddr(i, 0)
		if err := b.setCheck(name, i, 0, m, status); err != nil {
			return err
		}
		written := time.Now()
		last[i] = written
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		err := w.until(ctx, func(s map[string]*discoveryv1.EndpointSlice) bool {
			_, ready, _ := endpointsOf(s, name)
			r, ok := ready[addr]
			return ok && r == !critical[i]
		})
		cancel()
		if err != nil {
			return fmt.Errorf("check of %s (%s) not in its slice after 30 s: %w", name, status, err)
		}
		lat = append(lat, ms(time.Since(written)))
		if err := sleep(b.ctx, time.Duration(100+rand.IntN(50))*time.Millisecond); err != nil {
			return err
		}
	}
	s := sortedCopy(lat)
	note := fmt.Sprintf("%d samples; Consul write returned -> the slice in an informer", len(s))
	b.res.add(sc, "isolated check change -> EndpointSlice: p50", round2(percentile(s, 50)), "ms", note+"; target <= 20")
	b.res.add(sc, "isolated check change -> EndpointSlice: p99", round2(percentile(s, 99)), "ms", note+"; target <= 200")
	b.res.add(sc, "isolated check change -> EndpointSlice: max", round2(s[len(s)-1]), "ms", note)
	return nil
}

// healthWatches reads fleetsync_tok8s_health_watches by mode.
func (b *bench) healthWatches(d *fixture.Daemon) (blocking, polling float64, err error) {
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	resp, err := get(ctx, d.HTTP+"/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(raw), "\n") {
		for mode, v := range map[string]*float64{"blocking": &blocking, "polling": &polling} {
			if rest, ok := strings.CutPrefix(l, `fleetsync_tok8s_health_watches{mode="`+mode+`"} `); ok {
				*v, _ = strconv.ParseFloat(rest, 64)
			}
		}
	}
	return blocking, polling, nil
}
