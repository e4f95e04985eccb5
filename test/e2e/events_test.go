package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// TestBadAnnotationIsReportedAndIsolated: with --strict-annotations, a
// Service whose service-port names no port gets a Warning Event naming the
// Service and the annotation; it is not synced; a good Service next to it
// syncs as usual.
func TestBadAnnotationIsReportedAndIsolated(t *testing.T) {
	e := newEnv(t)
	ctx, c := e.ctx, kube.Client
	e.daemon("--strict-annotations")
	ports := map[string]int32{"http": 80}
	bad := map[string]string{optIn: "true", "consul.hashicorp.com/service-port": "grpc"}
	must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "bad", bad, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "bad", "bad-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(3, 0, 2))))
	must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "good", map[string]string{optIn: "true"}, ports)))
	must(t, fixture.ApplySlice(ctx, c, fixture.Slice(e.ns, "good", "good-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(4, 0, 2))))

	e.waitInstances("good", "10.4.0.1:80=passing,10.4.0.2:80=passing")
	var ev corev1.Event
	eventually(t, 15*time.Second, "Warning event on Service bad", func() error {
		list, err := c.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bad"})
		if err != nil {
			return err
		}
		for _, x := range list.Items {
			if x.Type == corev1.EventTypeWarning && x.Reason == "InvalidAnnotation" {
				ev = x
				return nil
			}
		}
		return fmt.Errorf("%d events, none InvalidAnnotation", len(list.Items))
	})
	t.Logf("event: %s %s: %s", ev.Type, ev.Reason, ev.Message)
	for _, s := range []string{e.ns + "/bad", "consul.hashicorp.com/service-port", `"grpc"`} {
		if !strings.Contains(ev.Message, s) {
			t.Errorf("event message %q does not mention %s", ev.Message, s)
		}
	}
	if ins, err := fixture.Instances(consul.Client, "bad", ""); err != nil || len(ins) != 0 {
		t.Errorf("bad Service synced anyway: %v %v", ins, err)
	}
	// An FQDN EndpointSlice of the good Service is ignored with an Event
	// naming the slice and the field; the Service's IP endpoints stay.
	fqdn := fixture.Slice(e.ns, "good", "good-fqdn", discoveryv1.AddressTypeFQDN, ports, []fixture.EP{{IP: "db.example.com"}})
	must(t, fixture.ApplySlice(ctx, c, fqdn))
	eventually(t, 15*time.Second, "EndpointSkipped event on Service good", func() error {
		list, err := c.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=good"})
		if err != nil {
			return err
		}
		for _, x := range list.Items {
			if x.Reason == "EndpointSkipped" && strings.Contains(x.Message, "good-fqdn") && strings.Contains(x.Message, "FQDN") {
				t.Logf("event: %s %s: %s", x.Type, x.Reason, x.Message)
				return nil
			}
		}
		return fmt.Errorf("%d events, none EndpointSkipped naming good-fqdn", len(list.Items))
	})
	e.waitInstances("good", "10.4.0.1:80=passing,10.4.0.2:80=passing")

	// Fixing the annotation syncs it.
	bad["consul.hashicorp.com/service-port"] = "http"
	must(t, fixture.ApplyService(ctx, c, fixture.Service(e.ns, "bad", bad, ports)))
	e.waitInstances("bad", "10.3.0.1:80=passing,10.3.0.2:80=passing")
}
