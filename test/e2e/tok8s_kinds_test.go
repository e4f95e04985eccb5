package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// setMode restarts d with --to-k8s-mode=mode in place of its current one.
func setMode(t *testing.T, e *env, d *fixture.Daemon, mode string) {
	t.Helper()
	var args []string
	for _, a := range d.Args {
		if !strings.HasPrefix(a, "--to-k8s-mode=") {
			args = append(args, a)
		}
	}
	d.Args = append(args, "--to-k8s-mode="+mode)
	must(t, d.Restart(e.ctx, false))
	must(t, d.WaitReady(e.ctx, 30*time.Second))
}

// waitService waits until Service name passes check.
func (e *env) waitService(name string, check func(*corev1.Service) error) *corev1.Service {
	e.t.Helper()
	var svc *corev1.Service
	eventually(e.t, 20*time.Second, "service "+name, func() error {
		var err error
		if svc, err = kube.Client.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		if svc.Labels["endpointslice.kubernetes.io/managed-by"] != "to-k8s.fleetsync.io" || svc.Labels["fleetsync.io/cluster"] != e.cluster ||
			svc.Spec.Selector != nil || svc.Annotations["fleetsync.io/consul-service"] == "" {
			return fmt.Errorf("not a mirrored Service: labels %v, annotations %v, selector %v", svc.Labels, svc.Annotations, svc.Spec.Selector)
		}
		return check(svc)
	})
	return svc
}

// TestToK8sMirrorKinds: --to-k8s-mode=headless makes a headless Service
// with slices; switched to externalname, fleetsync's Service becomes
// consul-k8s's object (type ExternalName, <name>.service.consul, no ports)
// and its slices go; switched to endpointslices, a ClusterIP Service with
// slices again; and to headless once more (a clusterIP that cannot change
// in place: the Service is replaced). Each switch is done once: quiet
// afterwards.
func TestToK8sMirrorKinds(t *testing.T) {
	e := newEnv(t)
	p := e.cluster + "k"
	web := p + "-web"
	vmInstance(t, p+"-vm1", "10.84.0.1", web, "k1", "", 8080, "passing")
	vmInstance(t, p+"-vm2", "10.84.0.2", web, "k2", "", 8080, "critical")
	slices := web + "-4-8080-0[IPv4:8080]: 10.84.0.1=true/true/false 10.84.0.2=false/false/false"
	d := e.daemon("--to-k8s", "--k8s-write-namespace="+e.ns, "--to-k8s-allow="+p+"-*", "--to-k8s-mode=headless")
	e.waitSlices(web, slices)
	e.waitService(web, func(s *corev1.Service) error {
		if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.ClusterIP != corev1.ClusterIPNone || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 8080 {
			return fmt.Errorf("want headless on 8080: %+v", s.Spec)
		}
		return nil
	})
	e.quiet("headless steady state", 2*time.Second)

	setMode(t, e, d, "externalname")
	e.waitService(web, func(s *corev1.Service) error {
		if s.Spec.Type != corev1.ServiceTypeExternalName || s.Spec.ExternalName != web+".service.consul" || len(s.Spec.Ports) != 0 ||
			s.Annotations["consul.hashicorp.com/service-sync"] != "false" {
			return fmt.Errorf("want consul-k8s's ExternalName object: annotations %v, spec %+v", s.Annotations, s.Spec)
		}
		return nil
	})
	e.waitSlices(web, "")
	e.quiet("externalname steady state", 3*time.Second)

	setMode(t, e, d, "endpointslices")
	e.waitSlices(web, slices)
	e.waitService(web, func(s *corev1.Service) error {
		if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone || len(s.Spec.Ports) != 1 {
			return fmt.Errorf("want a ClusterIP Service: %+v", s.Spec)
		}
		return nil
	})
	e.quiet("endpointslices steady state", 3*time.Second)

	// An allocated clusterIP cannot become None in place: replaced.
	setMode(t, e, d, "headless")
	e.waitService(web, func(s *corev1.Service) error {
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			return fmt.Errorf("want headless: %+v", s.Spec)
		}
		return nil
	})
	e.waitSlices(web, slices)
	e.quiet("headless again", 3*time.Second)
}
