package k8s

import (
	"fmt"
	goruntime "runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// BenchmarkService measures building one view of a Service with ten
// endpoints in two slices, the common case the supervisor pays per Changed.
func BenchmarkService(b *testing.B) {
	objs := []runtime.Object{newTestService("shop", "web")}
	for s := range 2 {
		slice := newTestSlice("shop", fmt.Sprintf("web-%d", s), "web", v4, ports(namedPort("http", 8080)))
		for i := range 5 {
			slice.Endpoints = append(slice.Endpoints, endpoint(fmt.Sprintf("p%d%d", s, i), fmt.Sprintf("10.0.%d.%d", s, i)))
		}
		objs = append(objs, slice)
	}
	w, _ := startWatcher(b, fake.NewClientset(objs...), 0)
	b.ReportAllocs()
	for b.Loop() {
		if svc, ok, err := w.Service(web); err != nil || !ok || len(svc.Endpoints) != 10 {
			b.Fatalf("Service() = %v, %v, %v", svc, ok, err)
		}
	}
}

// BenchmarkNodeCache reports the heap a cached Node costs with and without
// the transform (stripNode), for a Node shaped like a real one: labels,
// conditions, images, capacity and node info.
func BenchmarkNodeCache(b *testing.B) {
	for _, strip := range []bool{false, true} {
		b.Run(fmt.Sprintf("strip=%t", strip), func(b *testing.B) {
			const n = 5000
			var perNode float64
			for b.Loop() {
				keep := make([]any, 0, n)
				before := heapInUse()
				for i := range n {
					var obj any = realisticNode(i)
					if strip {
						obj, _ = stripNode(obj)
					}
					keep = append(keep, obj)
				}
				perNode = float64(heapInUse()-before) / n
				goruntime.KeepAlive(keep)
			}
			b.ReportMetric(perNode, "bytes/node")
		})
	}
}

func heapInUse() uint64 {
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapInuse
}

func realisticNode(i int) *corev1.Node {
	n := testNode(fmt.Sprintf("ip-10-0-%d-%d.eu-west-1.compute.internal", i/250, i%250), "12345678",
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250)},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: fmt.Sprintf("203.0.%d.%d", i/250, i%250)},
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: fmt.Sprintf("ip-10-0-%d-%d", i/250, i%250)})
	for j := range 15 {
		n.Labels[fmt.Sprintf("node.kubernetes.io/label-%d", j)] = fmt.Sprintf("value-%d-%d", i, j)
	}
	n.UID = types.UID(fmt.Sprintf("uid-%d", i))
	for j := range 30 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("registry.example.com/team/app-%d@sha256:%064d", j, i), fmt.Sprintf("registry.example.com/team/app-%d:v1.%d", j, i)},
			SizeBytes: 100 << 20})
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeNetworkUnavailable} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse,
			Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"})
	}
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"), corev1.ResourcePods: resource.MustParse("110")}
	n.Status.Allocatable = n.Status.Capacity.DeepCopy()
	n.Status.NodeInfo = corev1.NodeSystemInfo{MachineID: fmt.Sprintf("%032d", i), SystemUUID: fmt.Sprintf("%036d", i), BootID: fmt.Sprintf("%036d", i),
		KernelVersion: "6.1.0-1234-aws", OSImage: "Amazon Linux 2023", ContainerRuntimeVersion: "containerd://1.7.11", KubeletVersion: "v1.30.0", OperatingSystem: "linux", Architecture: "amd64"}
	return n
}

// BenchmarkSliceCache reports the heap a cached EndpointSlice of 10
// endpoints costs as decoded (protobuf, as the informer decodes it) with
// the old transform (stripForCache: managed fields and the
// last-applied annotation dropped) and with compactSlice, for a slice as
// the EndpointSlice controller writes it and for the minimal shape the
// benchmark program creates (test/fixture).
func BenchmarkSliceCache(b *testing.B) {
	for _, shape := range []string{"controller", "fixture"} {
		wire, err := realisticSlice(shape).Marshal()
		if err != nil {
			b.Fatal(err)
		}
		for _, transform := range []string{"strip", "compact"} {
			b.Run(fmt.Sprintf("shape=%s/transform=%s", shape, transform), func(b *testing.B) {
				const n = 2000
				var perSlice float64
				for b.Loop() {
					keep := make([]any, 0, n)
					before := heapInUse()
					for range n {
						s := &discoveryv1.EndpointSlice{}
						if err := s.Unmarshal(wire); err != nil {
							b.Fatal(err)
						}
						var obj any = s
						if transform == "strip" {
							obj, _ = stripForCache(obj)
						} else {
							obj, _ = compactSlice(obj)
						}
						keep = append(keep, obj)
					}
					perSlice = float64(heapInUse()-before) / n
					goruntime.KeepAlive(keep)
				}
				b.ReportMetric(perSlice, "bytes/slice")
			})
		}
	}
}

// realisticSlice is an EndpointSlice of 10 ready endpoints: "controller"
// as kube-controller-manager writes one (the Service's labels copied, an
// owner reference, the trigger-time annotation, a Pod reference with UID,
// node, zone, all three conditions), "fixture" as test/fixture.Slice does.
func realisticSlice(shape string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "payments", Name: "checkout-api-x7k2p", ResourceVersion: "123456789",
			Labels: map[string]string{discoveryv1.LabelServiceName: "checkout-api"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	controller := shape == "controller"
	if controller {
		s.GenerateName, s.UID, s.Generation = "checkout-api-", "9c1f7a52-3b9e-4d0a-8f6e-2a7c5d1e0b43", 42
		s.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
		for _, k := range []string{"app", "app.kubernetes.io/name", "app.kubernetes.io/part-of", "team", "version"} {
			s.Labels[k] = "checkout-api"
		}
		s.Annotations = map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-01T10:00:00Z"}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "checkout-api",
			UID: "0b5d2c1e-7a4f-4e9b-9d3c-6f1a8e2b7c50", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	}
	for i := range 10 {
		pod := fmt.Sprintf("checkout-api-7d9f8c6b5-%05d", i)
		ep := discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.42.%d.%d", i/250, i%250+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "payments", Name: pod}}
		if controller {
			ep.Conditions.Serving, ep.Conditions.Terminating = ptr.To(true), ptr.To(false)
			ep.TargetRef.UID = types.UID(fmt.Sprintf("5e3a9b2c-1d4f-4a6e-8b7c-%012d", i))
			ep.NodeName = ptr.To(fmt.Sprintf("ip-10-0-%d-17.eu-west-1.compute.internal", i%3))
			ep.Zone = ptr.To(fmt.Sprintf("eu-west-1%c", 'a'+i%3))
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}
