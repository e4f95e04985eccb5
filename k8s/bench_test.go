package k8s

import (
	"fmt"
	goruntime "runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
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
