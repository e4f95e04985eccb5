package e2e

import (
	"fmt"
	"sort"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestToK8sBudgetServiceWithItsSlices: many units starting together under
// a small write budget (40 Services and their slices at 5 writes/s, 16 s
// of writes): each flush prepays its writes, so every Service gets its
// slice right after it (creationTimestamps, 1 s resolution, at most 1 s
// apart) instead of after every other Service's create.
func TestToK8sBudgetServiceWithItsSlices(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "b"
	const n = 40
	for i := range n {
		vmInstance(t, fmt.Sprintf("%s-vm%d", p, i), fmt.Sprintf("10.86.0.%d", i+1), fmt.Sprintf("%s-s%d", p, i), "i1", "", 8080, "passing")
	}
	e.daemon("--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*", "--to-k8s-qps=5", "--to-k8s-burst=2")
	created := map[string]time.Time{} // Service -> its first slice's creation
	eventually(t, 60*time.Second, "a slice for each of the Services", func() error {
		list, err := kube.Client.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		clear(created)
		for _, s := range list.Items {
			svc := s.Labels[discoveryv1.LabelServiceName]
			if at, ok := created[svc]; !ok || s.CreationTimestamp.Time.Before(at) {
				created[svc] = s.CreationTimestamp.Time
			}
		}
		if len(created) != n {
			return fmt.Errorf("%d of %d Services have a slice", len(created), n)
		}
		return nil
	})
	svcs, err := kube.Client.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{})
	must(t, err)
	var gaps []time.Duration
	first, last := time.Time{}, time.Time{}
	for _, svc := range svcs.Items {
		at, ok := created[svc.Name]
		if !ok {
			t.Fatalf("Service %s without a slice", svc.Name)
		}
		gaps = append(gaps, at.Sub(svc.CreationTimestamp.Time))
		if first.IsZero() || svc.CreationTimestamp.Time.Before(first) {
			first = svc.CreationTimestamp.Time
		}
		if at.After(last) {
			last = at
		}
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	t.Logf("%d Services mirrored in %s; Service -> first slice: median %s, max %s", len(gaps), last.Sub(first), gaps[len(gaps)/2], gaps[len(gaps)-1])
	if len(gaps) != n || gaps[len(gaps)-1] > time.Second {
		t.Fatalf("Service -> first slice gaps %v, want %d Services each with its slice within 1 s", gaps, n)
	}
}
