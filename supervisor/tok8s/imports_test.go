package tok8s

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/consul/watch"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

func annotated(ann map[string]string) *k8s.Service {
	obj := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", Annotations: ann},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Name: "pg", Port: 5432}}}}
	return &k8s.Service{Key: k8s.Key{Namespace: "ns", Name: "db"}, Annotations: ann, Object: obj}
}

// TestImportOf: the optional annotations become the unit's query and
// window; a bad one is a problem naming the annotation (and the unit gets
// no slices).
func TestImportOf(t *testing.T) {
	base := func(kv ...string) map[string]string {
		m := map[string]string{k8smark.AnnotationConsulService: "postgres"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name    string
		ann     map[string]string
		query   watch.Query
		window  time.Duration
		problem string // a substring; "" for none
	}{
		{"none", base(), watch.Query{}, -1, ""},
		{"every one", base(AnnotationDatacenter, "dc2", AnnotationNamespace, "team-a", AnnotationPartition, "part-b",
			AnnotationTag, " primary ", AnnotationFilter, `Service.Meta.env == "prod"`, AnnotationWindow, "250ms"),
			watch.Query{Datacenter: "dc2", Namespace: "team-a", Partition: "part-b", Tag: "primary", Filter: `Service.Meta.env == "prod"`}, 250 * time.Millisecond, ""},
		{"window 0", base(AnnotationWindow, "0"), watch.Query{}, 0, ""},
		{"bad datacenter", base(AnnotationDatacenter, "DC 2"), watch.Query{}, -1, `annotation fleetsync.io/consul-datacenter="DC 2": not a Consul datacenter name`},
		{"bad namespace", base(AnnotationNamespace, "team_a"), watch.Query{}, -1, `annotation fleetsync.io/consul-namespace="team_a"`},
		{"bad partition", base(AnnotationPartition, ""), watch.Query{}, -1, `annotation fleetsync.io/consul-partition=""`},
		{"empty tag", base(AnnotationTag, " "), watch.Query{}, -1, `annotation fleetsync.io/consul-tag=" "`},
		{"bad filter", base(AnnotationFilter, `Service.Meta.env ==`), watch.Query{}, -1, `annotation fleetsync.io/consul-filter="Service.Meta.env ==": not a Consul filter expression`},
		{"bad window", base(AnnotationWindow, "soon"), watch.Query{}, -1, `annotation fleetsync.io/window="soon": is not a Go duration`},
		{"window too long", base(AnnotationWindow, "2h"), watch.Query{}, -1, `annotation fleetsync.io/window="2h": must be between`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, ok := importOf(annotated(tt.ann))
			if !ok {
				t.Fatal("not an import")
			}
			if tt.problem != "" {
				if !strings.Contains(u.problem, tt.problem) {
					t.Fatalf("problem %q, want it to contain %q", u.problem, tt.problem)
				}
				return
			}
			if u.problem != "" || u.src.query != tt.query || u.src.window != tt.window || u.src.consul != "postgres" || u.port != "pg" {
				t.Fatalf("got %+v, want query %+v window %v", u, tt.query, tt.window)
			}
		})
	}
}

// TestImportOfMirrored: a mirrored Service carries the annotation too, and
// the mark: it is not an import (else both modes on would read it without
// mirror mode's query).
func TestImportOfMirrored(t *testing.T) {
	svc := annotated(map[string]string{k8smark.AnnotationConsulService: "web"})
	mark, err := k8smark.New("c1")
	if err != nil {
		t.Fatal(err)
	}
	mark.Stamp(svc.Object)
	if u, ok := importOf(svc); ok {
		t.Fatalf("a mirrored Service read as an import: %+v", u)
	}
}

// TestFeed: a worker reads its source's query and runs with its window;
// a unit that is not selected reads nothing and keeps the fleet's window.
func TestFeed(t *testing.T) {
	var asked watch.Query
	s := New(Options{Config: wtok8s.Config{Window: time.Second}, Health: func(_ context.Context, _ string, q watch.Query, _ uint64) (watch.Instances, uint64, error) {
		asked = q
		return watch.Instances{}, 1, nil
	}})
	q := watch.Query{Datacenter: "dc2", Tag: "primary"}
	health, cfg := s.feed(source{consul: "postgres", query: q, window: 0})
	if health == nil || cfg.Window != 0 {
		t.Fatalf("health %v, window %v; want a read and window 0", health != nil, cfg.Window)
	}
	if _, _, err := health(context.Background(), "postgres", 0); err != nil || asked != q {
		t.Fatalf("asked %+v (%v), want %+v", asked, err, q)
	}
	if _, cfg := s.feed(source{consul: "postgres", window: -1}); cfg.Window != time.Second {
		t.Errorf("default window %v", cfg.Window)
	}
	if health, cfg := s.feed(source{}); health != nil || cfg.Window != time.Second {
		t.Errorf("unselected: health %v, window %v", health != nil, cfg.Window)
	}
}
