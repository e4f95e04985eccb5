package e2e

import (
	"fmt"
	"slices"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

const optIn = "consul.hashicorp.com/service-sync"

// TestServiceLifecycle: create, scale, change conditions, change annotations,
// rename and delete; Consul follows each step.
func TestServiceLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx, c := e.ctx, kube.Client
	e.daemon()
	ports := map[string]int32{"http": 8080, "metrics": 9100}
	ann := map[string]string{optIn: "true", "consul.hashicorp.com/service-tags": "a,b\\,c",
		"consul.hashicorp.com/service-meta-team": "payments"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "web", ann, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "web", "web-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 3))))

	got := e.waitInstances("web", "10.1.0.1:8080=passing,10.1.0.2:8080=passing,10.1.0.3:8080=passing")
	in := got[0]
	if want := []string{"k8s", "a", "b,c", e.cluster}; !slices.Equal(in.Tags, want) {
		t.Errorf("tags = %q, want %q", in.Tags, want)
	}
	for k, v := range map[string]string{"external-source": "kubernetes", "k8s-cluster": e.cluster,
		"k8s-namespace": e.ns, "k8s-service": "web", "k8s-pod": "pod-0", "team": "payments"} {
		if in.Meta[k] != v {
			t.Errorf("meta %s = %q, want %q (all: %v)", k, in.Meta[k], v, in.Meta)
		}
	}
	if in.ID != fmt.Sprintf("k8s_%s_%s_web_10.1.0.1_8080", e.cluster, e.ns) {
		t.Errorf("instance id = %q", in.ID)
	}

	t.Run("scale up", func(t *testing.T) {
		must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "web", "web-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 5))))
		e.waitInstances("web", "10.1.0.1:8080=passing,10.1.0.2:8080=passing,10.1.0.3:8080=passing,10.1.0.4:8080=passing,10.1.0.5:8080=passing")
	})
	t.Run("conditions", func(t *testing.T) {
		eps := fixture.IPs(1, 0, 5)
		eps[0].NotReady = true
		eps[1].Terminating = true
		must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "web", "web-1", discoveryv1.AddressTypeIPv4, ports, eps)))
		e.waitInstances("web", "10.1.0.2:8080=warning,10.1.0.3:8080=passing,10.1.0.4:8080=passing,10.1.0.5:8080=passing")
	})
	t.Run("second slice and scale down", func(t *testing.T) {
		must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "web", "web-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(1, 0, 2))))
		must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "web", "web-2", discoveryv1.AddressTypeIPv6, ports,
			[]fixture.EP{{IP: "fd00::1"}, {IP: "fd00::2"}})))
		e.waitInstances("web", "10.1.0.1:8080=passing,10.1.0.2:8080=passing,fd00::1:8080=passing,fd00::2:8080=passing")
	})
	t.Run("port and tags annotations", func(t *testing.T) {
		ann["consul.hashicorp.com/service-port"] = "metrics"
		ann["consul.hashicorp.com/service-tags"] = "x"
		must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "web", ann, ports)))
		got := e.waitInstances("web", "10.1.0.1:9100=passing,10.1.0.2:9100=passing,fd00::1:9100=passing,fd00::2:9100=passing")
		if want := []string{"k8s", "x", e.cluster}; !slices.Equal(got[0].Tags, want) {
			t.Errorf("tags = %q, want %q", got[0].Tags, want)
		}
	})
	t.Run("rename moves instances", func(t *testing.T) {
		ann["consul.hashicorp.com/service-name"] = "web-renamed"
		must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "web", ann, ports)))
		e.waitInstances("web-renamed", "10.1.0.1:9100=passing,10.1.0.2:9100=passing,fd00::1:9100=passing,fd00::2:9100=passing")
		e.waitInstances("web", "")
	})
	t.Run("opt out deregisters", func(t *testing.T) {
		ann[optIn] = "false"
		must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "web", ann, ports)))
		e.waitInstances("web-renamed", "")
	})
	t.Run("opt in again, then delete the Service", func(t *testing.T) {
		ann[optIn] = "true"
		must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "web", ann, ports)))
		e.waitInstances("web-renamed", "10.1.0.1:9100=passing,10.1.0.2:9100=passing,fd00::1:9100=passing,fd00::2:9100=passing")
		must(t, c.CoreV1().Services(e.ns).Delete(ctx, "web", metav1.DeleteOptions{}))
		e.waitInstances("web-renamed", "")
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
