package tok8s

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/k8s/apply"
	"github.com/fleetsync/fleetsync/k8s/owned"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

// blockingCatalog answers names at once, then blocks until ctx is done.
func blockingCatalog(names ...string) Catalog {
	return func(ctx context.Context, index uint64) (watch.Catalog, uint64, error) {
		if index > 0 {
			<-ctx.Done()
			return watch.Catalog{}, 0, ctx.Err()
		}
		return catalog(names...), 1, nil
	}
}

// fakeImports is a fixed set of Services (import mode's source).
type fakeImports map[k8s.Key]*k8s.Service

func (f fakeImports) WaitForSync(context.Context) bool { return true }
func (f fakeImports) Keys() []k8s.Key {
	var out []k8s.Key
	for k := range f {
		out = append(out, k)
	}
	return out
}
func (f fakeImports) Head(k k8s.Key) (*k8s.Service, bool, error) {
	s, ok := f[k]
	return s, ok, nil
}

// TestSupervisorImportMetrics runs import mode on a fake API server: one
// usable Service with a tag annotation and one with a bad filter. The
// usable one's health read carries the tag, its slice is written once and
// its worker reports it (Workers, per-worker series); the bad one has no
// worker, and is not started again and again (one worker started in all).
func TestSupervisorImportMetrics(t *testing.T) {
	kube := fake.NewClientset()
	// The fake keeps no resourceVersions; the worker compares them.
	var rv atomic.Int64
	kube.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(clienttesting.CreateAction); ok {
			if m, err := meta.Accessor(o.GetObject()); err == nil {
				m.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
			}
		}
		if o, ok := a.(clienttesting.UpdateAction); ok {
			if m, err := meta.Accessor(o.GetObject()); err == nil {
				m.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
			}
		}
		return false, nil, nil
	})
	mark, err := k8smark.New("c1")
	if err != nil {
		t.Fatal(err)
	}
	writer, err := apply.New(kube, mark, apply.Options{})
	if err != nil {
		t.Fatal(err)
	}
	good := annotated(map[string]string{k8smark.AnnotationConsulService: "postgres", AnnotationTag: "primary"})
	good.Object.UID = "uid-db"
	if _, err := kube.CoreV1().Services("ns").Create(context.Background(), good.Object, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := annotated(map[string]string{k8smark.AnnotationConsulService: "postgres", AnnotationFilter: "Service.Meta.env =="})
	bad.Key.Name, bad.Object.Name = "bad", "bad"
	var mu sync.Mutex
	var queries []watch.Query
	health := func(ctx context.Context, name string, q watch.Query, index uint64) (watch.Instances, uint64, error) {
		mu.Lock()
		queries = append(queries, q)
		mu.Unlock()
		if index > 0 {
			<-ctx.Done() // a blocking query that never changes
			return watch.Instances{}, 0, ctx.Err()
		}
		return watch.Instances{Entries: []watch.Entry{
			{Node: watch.Node{Name: "vm1", Address: "10.0.0.1"}, ID: "a", Service: name, Port: 5432, Tags: []string{"primary"}, Status: watch.StatusPassing},
			{Node: watch.Node{Name: "vm2", Address: "10.0.0.2"}, ID: "b", Service: name, Port: 5432, Tags: []string{"primary"}, Status: watch.StatusPassing},
		}}, 5, nil
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, -1)
	wrote := make(chan int, 10)
	sup := New(Options{
		Config: wtok8s.Config{Mark: mark}, Health: health, Owned: owned.New(kube, mark.Selector(), ""), Writer: writer,
		Imports: fakeImports{good.Key: good, bad.Key: bad}, Metrics: m, Catalog: blockingCatalog("postgres"),
		Observe: func(n int, err error) {
			if err != nil {
				t.Errorf("flush: %v", err)
			}
			wrote <- n
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	if n := <-wrote; n != 1 {
		t.Fatalf("first flush wrote %d, want 1 (one slice)", n)
	}
	sts := sup.Workers()
	if len(sts) != 1 || sts[0].Service != "db" || sts[0].ConsulService != "postgres" || sts[0].Endpoints != 2 || sts[0].Writes != 1 ||
		sts[0].Flushes != 1 || !sts[0].Known || sts[0].Mirror {
		t.Fatalf("Workers() = %+v", sts)
	}
	mu.Lock()
	if len(queries) == 0 || queries[0] != (watch.Query{Tag: "primary"}) {
		t.Errorf("health queries %+v, want the tag", queries)
	}
	mu.Unlock()
	want := `
# HELP fleetsync_tok8s_worker_writes_total Kubernetes writes (Services and EndpointSlices).
# TYPE fleetsync_tok8s_worker_writes_total counter
fleetsync_tok8s_worker_writes_total{namespace="ns",service="db"} 1
# HELP fleetsync_tok8s_worker_endpoints Endpoints wanted in the unit's EndpointSlices at the last look (the Consul instances mirrored).
# TYPE fleetsync_tok8s_worker_endpoints gauge
fleetsync_tok8s_worker_endpoints{namespace="ns",service="db"} 2
# HELP fleetsync_tok8s_workers Consul -> Kubernetes workers running.
# TYPE fleetsync_tok8s_workers gauge
fleetsync_tok8s_workers 1
# HELP fleetsync_tok8s_workers_started_total Consul -> Kubernetes workers started (one per unit; a unit whose source changed starts a new one).
# TYPE fleetsync_tok8s_workers_started_total counter
fleetsync_tok8s_workers_started_total 1
# HELP fleetsync_tok8s_writes_total Kubernetes writes (creates, updates, deletes of Services and EndpointSlices) of the Consul -> Kubernetes direction.
# TYPE fleetsync_tok8s_writes_total counter
fleetsync_tok8s_writes_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fleetsync_tok8s_worker_writes_total", "fleetsync_tok8s_worker_endpoints",
		"fleetsync_tok8s_workers", "fleetsync_tok8s_workers_started_total", "fleetsync_tok8s_writes_total"); err != nil {
		t.Error(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestPick(t *testing.T) {
	sts := []wtok8s.Status{{Service: "idle"}, {Service: "busy", Writes: 9}, {Service: "failing", LastError: "x"}}
	names := func(sts []wtok8s.Status) string {
		var out []string
		for _, s := range sts {
			out = append(out, s.Service)
		}
		return strings.Join(out, ",")
	}
	for _, tt := range []struct {
		per  int
		want string
	}{{-1, "idle,busy,failing"}, {0, ""}, {2, "failing,busy"}, {5, "failing,busy,idle"}} {
		if got := names((&Metrics{PerWorker: tt.per}).pick(sts)); got != tt.want {
			t.Errorf("PerWorker %d: %s, want %s", tt.per, got, tt.want)
		}
	}
}
