package e2e

import (
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// TestConsulK8sNamesSynced: what consul-k8s syncs, fleetsync syncs too: a
// dotted service-name of 80 characters (Consul stores it; Consul DNS cannot
// look it up) and a service-port naming no port (the first port) are
// synced, each with a Warning Event naming the Service and the
// annotation. TestBadAnnotationIsReportedAndIsolated checks that
// --strict-annotations refuses the same.
func TestConsulK8sNamesSynced(t *testing.T) {
	e := newTypesEnv(t)
	e.daemon()
	ports := map[string]int32{"http": 80, "metrics": 9090}
	long := strings.Repeat("a", 70) + ".web.shop"
	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, "dotted",
		map[string]string{optIn: "true", "consul.hashicorp.com/service-name": long}, ports)))
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, "dotted", "dotted-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(5, 0, 2))))
	must(t, fixture.ApplyService(e.ctx, kube.Client, fixture.Service(e.ns, "port",
		map[string]string{optIn: "true", "consul.hashicorp.com/service-port": "grpc"}, ports)))
	must(t, fixture.ApplySlice(e.ctx, kube.Client, fixture.Slice(e.ns, "port", "port-1", discoveryv1.AddressTypeIPv4, ports, fixture.IPs(6, 0, 1))))

	e.waitInstances(long, "10.5.0.1:80=passing,10.5.0.2:80=passing")
	e.waitEvent("dotted", "InvalidAnnotation", e.ns+"/dotted", "consul.hashicorp.com/service-name", long+".service.consul does not resolve")
	e.waitInstances("port", "10.6.0.1:80=passing") // http, the first of http and metrics
	e.waitEvent("port", "InvalidAnnotation", e.ns+"/port", "consul.hashicorp.com/service-port", `no port named "grpc"`, "using the first port")
}
