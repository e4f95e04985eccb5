package e2e

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// burst writes n versions of the slice of service svc, one every 40 ms (so
// 50 span 2 s: the window's max-delay rule is exercised, not only the
// coalescing), the last one holding last.
func burst(t *testing.T, e *env, svc string, n int, last []fixture.EP) {
	t.Helper()
	ports := map[string]int32{"http": 80}
	tick := time.NewTicker(40 * time.Millisecond)
	defer tick.Stop()
	for i := range n - 1 {
		must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, svc, svc+"-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(7, i%5, 3))))
		<-tick.C
	}
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, svc, svc+"-1", discoveryv1.AddressTypeIPv4, ports, last)))
}

// TestWindowFoldsABurst: 50 changes to one service within about 2 s reach
// Consul in at most 3 transactions with W=1s, and in many more with W=0.
func TestWindowFoldsABurst(t *testing.T) {
	final := fixture.IPs(7, 20, 4)
	want := "10.7.0.21:80=passing,10.7.0.22:80=passing,10.7.0.23:80=passing,10.7.0.24:80=passing"
	txns := map[string]float64{}
	var tookW1 time.Duration
	for _, window := range []string{"1s", "0s"} {
		t.Run("window="+window, func(t *testing.T) {
			e := newEnv(t)
			ports := map[string]int32{"http": 80}
			must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, "flappy", map[string]string{optIn: "true"}, ports)))
			e.daemon("--window=" + window)
			// Let the Service's creation flush and its window pass.
			e.waitInstances("flappy", "")
			time.Sleep(1500 * time.Millisecond) // a quiet period before the burst
			before := catalogTxns(t)
			start := time.Now()
			burst(t, e, "flappy", 50, final)
			took := time.Since(start)
			e.waitInstances("flappy", want)
			time.Sleep(1500 * time.Millisecond) // a later window must not write more
			txns[window] = catalogTxns(t) - before
			if window == "1s" {
				tookW1 = took
			}
			t.Logf("W=%s: 50 slice writes in %s -> %v Consul transactions", window, took.Round(time.Millisecond), txns[window])
		})
	}
	// A leading-edge flush, then at most one per window while the burst
	// lasts: 3 for a burst of at most 2 s (a slow API server can stretch
	// the burst; the bound follows the measured duration).
	if limit := float64(int(tookW1/time.Second) + 2); txns["1s"] > limit {
		t.Errorf("W=1s: %v transactions for 50 changes in %s, want at most %v", txns["1s"], tookW1, limit)
	}
	if txns["0s"] < 3*txns["1s"] {
		t.Errorf("W=0: %v transactions, want many more than W=1s (%v)", txns["0s"], txns["1s"])
	}
}

// TestIsolatedChangeLatency measures the time from an EndpointSlice write
// returning to the change being visible in a Consul blocking query, after a
// quiet period, with W=1s. The figures are logged (make bench measures them: docs/performance.md);
// the only assertion is that each change arrives.
func TestIsolatedChangeLatency(t *testing.T) {
	e := newEnv(t)
	ports := map[string]int32{"http": 80}
	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, "quiet", map[string]string{optIn: "true"}, ports)))
	e.daemon()
	e.waitInstances("quiet", "")
	var lat []time.Duration
	for i := range 8 {
		time.Sleep(1100 * time.Millisecond) // a quiet period longer than the window
		_, meta, err := consul.Client.Health().Service("quiet", "", false, nil)
		must(t, err)
		eps := fixture.IPs(8, i, 1)
		start := time.Now()
		must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, "quiet", "quiet-1", discoveryv1.AddressTypeIPv4, ports, eps)))
		written := time.Now()
		index := meta.LastIndex
		for {
			entries, m, err := consul.Client.Health().Service("quiet", "", false, &consulapi.QueryOptions{WaitIndex: index, WaitTime: 10 * time.Second})
			must(t, err)
			if len(entries) == 1 && entries[0].Service.Address == eps[0].IP {
				break
			}
			if m.LastIndex < index {
				index = 0
			} else {
				index = m.LastIndex
			}
			if time.Since(start) > 15*time.Second {
				t.Fatalf("change %d not in Consul after 15s", i)
			}
		}
		lat = append(lat, time.Since(written))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("isolated change, slice write returned -> visible in Consul: p50 %s, max %s over %d tries (%v)",
		lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond), len(lat), lat)
}

// TestWriteBudgetCapsConsulWrites: 40 services changing 10 times each, as
// fast as the API server allows, with a budget of 10 transactions/s (burst
// 2): Consul's Raft apply rate stays within the budget, and every service
// reaches its final state once the churn stops.
func TestWriteBudgetCapsConsulWrites(t *testing.T) {
	e := newEnv(t)
	ctx, c := e.ctx, kube.Client
	const services, rounds, budget, burstN = 40, 10, 10, 2
	ports := map[string]int32{"http": 80}
	for i := range services {
		must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, fmt.Sprintf("churn-%d", i), map[string]string{optIn: "true"}, ports)))
	}
	e.daemon("--window=0", fmt.Sprintf("--consul-max-writes-per-second=%d", budget), fmt.Sprintf("--consul-write-burst=%d", burstN))
	time.Sleep(time.Second) // let the creation flushes (if any) drain

	// Sample Consul's running apply count every 500 ms during the churn.
	stop := make(chan struct{})
	var samples []float64
	var times []time.Time
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			v, err := consul.RaftApplies()
			if err == nil {
				samples = append(samples, v)
				times = append(times, time.Now())
			}
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	var werr error
	var wmu sync.Mutex
	var writers sync.WaitGroup
	for i := range services {
		writers.Add(1)
		go func() {
			defer writers.Done()
			name := fmt.Sprintf("churn-%d", i)
			for r := range rounds {
				if err := fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, name, name+"-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(9, i*10+r, 2))); err != nil {
					wmu.Lock()
					werr = err
					wmu.Unlock()
				}
			}
		}()
	}
	writers.Wait()
	must(t, werr)
	// Every service reaches its final state.
	for i := range services {
		final := fixture.IPs(9, i*10+rounds-1, 2)
		e.waitInstancesWithin(fmt.Sprintf("churn-%d", i), fmt.Sprintf("%s:80=passing,%s:80=passing", final[0].IP, final[1].IP), 60*time.Second)
	}
	close(stop)
	wg.Wait()

	// The highest rate over any 1 s span between samples two apart.
	var worst float64
	var rates []string
	for i := 2; i < len(samples); i++ {
		r := (samples[i] - samples[i-2]) / times[i].Sub(times[i-2]).Seconds()
		rates = append(rates, fmt.Sprintf("%.0f", r))
		worst = max(worst, r)
	}
	total := samples[len(samples)-1] - samples[0]
	t.Logf("budget %d/s burst %d: %v transactions for %d slice writes; Raft applies/s over 1 s spans: max %.1f [%s]",
		budget, burstN, total, services*rounds, worst, strings.Join(rates, " "))
	// The limiter allows budget per second plus the burst once; sampling
	// adds up to one transaction of slack at each end of a span.
	if worst > budget+burstN+2 {
		t.Errorf("Consul write rate reached %.1f/s, budget is %d/s (+%d burst)", worst, budget, burstN)
	}
}

// waitInstancesWithin is waitInstances with another timeout.
func (e *env) waitInstancesWithin(name, want string, timeout time.Duration) {
	e.t.Helper()
	eventually(e.t, timeout, "consul service "+name, func() error {
		got, err := fixture.Instances(consul.Client, name, e.node())
		if err != nil {
			return err
		}
		if k := fixture.Keys(got, true); k != want {
			return fmt.Errorf("have %q, want %q", k, want)
		}
		return nil
	})
}
