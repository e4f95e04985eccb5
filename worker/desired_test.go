package worker

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
)

// inst is the instance Desired should produce for endpoint ep of shop/web
// under testConfig: name web, tags [k8s <user tags...> east], full meta.
func inst(ep k8s.Endpoint, port int, status, output string, userTags ...string) consul.Instance {
	meta := map[string]string{
		"external-source": "kubernetes", "k8s-cluster": "east",
		MetaNamespace: testNS, MetaService: testName,
	}
	setIf(meta, MetaPod, ep.Pod)
	setIf(meta, MetaNode, ep.Node)
	setIf(meta, MetaZone, ep.Zone)
	return consul.Instance{
		ID:      fmt.Sprintf("k8s_east_shop_web_%s_%d", ep.Address, port),
		Name:    testName,
		Address: ep.Address,
		Port:    port,
		Tags:    append(append([]string{"k8s"}, userTags...), "east"),
		Meta:    meta,
		Check:   consul.Check{Status: status, Output: output},
	}
}

func passing(ep k8s.Endpoint, port int) consul.Instance {
	return inst(ep, port, consul.StatusPassing, OutputReady)
}

func TestDesired(t *testing.T) {
	a, b := ready("10.0.0.1", "a"), ready("10.0.0.2", "b")
	v6 := ready("fd00::1", "c")
	terminating := k8s.Endpoint{Address: "10.0.0.7", Ports: map[string]int32{"http": 8080}, Serving: true, Terminating: true, Pod: "t"}
	gone := k8s.Endpoint{Address: "10.0.0.8", Ports: map[string]int32{"http": 8080}, Terminating: true, Pod: "g"}
	notReady := k8s.Endpoint{Address: "10.0.0.9", Ports: map[string]int32{"http": 8080}, Pod: "n"}
	bare := k8s.Endpoint{Address: "10.0.0.5", Ports: map[string]int32{"http": 8080}, Ready: true}
	noMetrics := k8s.Endpoint{Address: "10.0.0.6", Ports: map[string]int32{"http": 8080}, Ready: true}
	unnamed := k8s.Endpoint{Address: "10.0.0.4", Ports: map[string]int32{"": 3000}, Ready: true}

	withName := func(i consul.Instance, name string) consul.Instance { i.Name = name; return i }
	withMeta := func(i consul.Instance, kv ...string) consul.Instance {
		for j := 0; j < len(kv); j += 2 {
			i.Meta[kv[j]] = kv[j+1]
		}
		return i
	}
	withTags := func(i consul.Instance, tags ...string) consul.Instance { i.Tags = tags; return i }

	tests := []struct {
		name     string
		svc      *k8s.Service
		cfg      func(*Config)
		want     []consul.Instance
		wantName string
		window   time.Duration
		warnings []string // substrings, one per warning
	}{
		{
			name: "default name, first port, sorted by ID",
			svc:  newSvc([]k8s.Endpoint{b, a}),
			want: []consul.Instance{passing(a, 8080), passing(b, 8080)},
		},
		{
			name: "no endpoints",
			svc:  newSvc(nil),
		},
		{
			name:     "service-name override",
			svc:      newSvc([]k8s.Endpoint{a}, withAnn(AnnotationName, " shop-web ")),
			want:     []consul.Instance{withName(passing(a, 8080), "shop-web")},
			wantName: "shop-web",
		},
		{
			name:     "prefix and namespace suffix",
			svc:      newSvc([]k8s.Endpoint{a}),
			cfg:      func(c *Config) { c.ServicePrefix = "k-"; c.AddNamespaceSuffix = true },
			want:     []consul.Instance{withName(passing(a, 8080), "k-web-shop")},
			wantName: "k-web-shop",
		},
		{
			name:     "service-name wins over prefix and suffix",
			svc:      newSvc([]k8s.Endpoint{a}, withAnn(AnnotationName, "api")),
			cfg:      func(c *Config) { c.ServicePrefix = "k-"; c.AddNamespaceSuffix = true },
			want:     []consul.Instance{withName(passing(a, 8080), "api")},
			wantName: "api",
		},
		{
			name: "user tags between k8s tag and ownership tag, deduplicated",
			svc:  newSvc([]k8s.Endpoint{a}, withAnn(AnnotationTags, `v1, k8s ,x\,y,v1,,east`)),
			want: []consul.Instance{withTags(passing(a, 8080), "k8s", "v1", "x,y", "east")},
		},
		{
			name: "no k8s tag",
			svc:  newSvc([]k8s.Endpoint{a}, withAnn(AnnotationTags, "blue")),
			cfg:  func(c *Config) { c.K8sTag = "" },
			want: []consul.Instance{withTags(passing(a, 8080), "blue", "east")},
		},
		{
			name:     "user tag equal to another cluster's id left out with a warning",
			svc:      newSvc([]k8s.Endpoint{a}, withAnn(AnnotationTags, "v1,west,blue")),
			cfg:      func(c *Config) { c.ReservedTag = reserveClusters("west", "north") },
			want:     []consul.Instance{withTags(passing(a, 8080), "k8s", "v1", "blue", "east")},
			warnings: []string{`service shop/web: annotation consul.hashicorp.com/service-tags="v1,west,blue": tag "west" is the ownership tag of cluster west in this Consul, so west.web.service.consul would also return this cluster's instances: left out`},
		},
		{
			name: "reserved tags matched as Consul does, ignoring case; one warning each",
			svc:  newSvc([]k8s.Endpoint{a}, withAnn(AnnotationTags, "West,v1,NORTH,west")),
			cfg:  func(c *Config) { c.ReservedTag = reserveClusters("west", "north") },
			want: []consul.Instance{withTags(passing(a, 8080), "k8s", "v1", "east")},
			warnings: []string{
				`tag "West" is the ownership tag of cluster west`,
				`tag "NORTH" is the ownership tag of cluster north`,
				`tag "west" is the ownership tag of cluster west`,
			},
		},
		{
			name:     "--k8s-tag equal to another cluster's id left out with a warning naming the flag",
			svc:      newSvc([]k8s.Endpoint{a}, withAnn(AnnotationName, "api")),
			cfg:      func(c *Config) { c.K8sTag = "west"; c.ReservedTag = reserveClusters("west") },
			want:     []consul.Instance{withTags(withName(passing(a, 8080), "api"), "east")},
			wantName: "api",
			warnings: []string{`service shop/web: --k8s-tag "west" is the ownership tag of cluster west in this Consul, so west.api.service.consul would also return this cluster's instances: left out`},
		},
		{
			name: "own cluster id is never reserved",
			svc:  newSvc([]k8s.Endpoint{a}, withAnn(AnnotationTags, "v1,east")),
			cfg:  func(c *Config) { c.ReservedTag = reserveClusters("east", "west") },
			want: []consul.Instance{withTags(passing(a, 8080), "k8s", "v1", "east")},
		},
		{
			name: "no other cluster: tags kept",
			svc:  newSvc([]k8s.Endpoint{a}, withAnn(AnnotationTags, "west")),
			cfg:  func(c *Config) { c.ReservedTag = reserveClusters() },
			want: []consul.Instance{withTags(passing(a, 8080), "k8s", "west", "east")},
		},
		{
			name: "user meta next to the instance meta",
			svc:  newSvc([]k8s.Endpoint{a}, withAnn(AnnotationMeta+"team", "payments", AnnotationMeta+"tier", "")),
			want: []consul.Instance{withMeta(passing(a, 8080), "team", "payments", "tier", "")},
		},
		{
			name: "endpoint without pod, node and zone",
			svc:  newSvc([]k8s.Endpoint{bare}),
			want: []consul.Instance{passing(bare, 8080)},
		},
		{
			name: "port by name",
			svc:  newSvc([]k8s.Endpoint{a, b}, withAnn(AnnotationPort, "metrics")),
			want: []consul.Instance{passing(a, 9100), passing(b, 9100)},
		},
		{
			name: "port by number is used as is",
			svc:  newSvc([]k8s.Endpoint{a, unnamed}, withAnn(AnnotationPort, "7000")),
			want: []consul.Instance{passing(a, 7000), passing(unnamed, 7000)},
		},
		{
			name:     "endpoint without the named port skipped with a warning",
			svc:      newSvc([]k8s.Endpoint{a, noMetrics}, withAnn(AnnotationPort, "metrics")),
			want:     []consul.Instance{passing(a, 9100)},
			warnings: []string{`service shop/web: endpoint 10.0.0.6 has no port "metrics", skipped`},
		},
		{
			name: "unnamed first port",
			svc: newSvc([]k8s.Endpoint{unnamed}, func(s *k8s.Service) {
				s.Ports = []k8s.Port{{Port: 80}}
			}),
			want: []consul.Instance{passing(unnamed, 3000)},
		},
		{
			name: "IPv6 addresses",
			svc:  newSvc([]k8s.Endpoint{a, v6}),
			want: []consul.Instance{passing(a, 8080), passing(v6, 8080)},
		},
		{
			name: "terminating: warning by default; not serving and not ready skipped",
			svc:  newSvc([]k8s.Endpoint{a, terminating, gone, notReady}),
			want: []consul.Instance{passing(a, 8080), inst(terminating, 8080, consul.StatusWarning, OutputTerminating)},
		},
		{
			name: "terminating: critical",
			svc:  newSvc([]k8s.Endpoint{terminating}),
			cfg:  func(c *Config) { c.Terminating = TerminatingCritical },
			want: []consul.Instance{inst(terminating, 8080, consul.StatusCritical, OutputTerminating)},
		},
		{
			name: "terminating: drop",
			svc:  newSvc([]k8s.Endpoint{a, terminating}),
			cfg:  func(c *Config) { c.Terminating = TerminatingDrop },
			want: []consul.Instance{passing(a, 8080)},
		},
		{
			name: "not ready registered critical when asked",
			svc:  newSvc([]k8s.Endpoint{a, gone, notReady}),
			cfg:  func(c *Config) { c.RegisterNotReady = true },
			want: []consul.Instance{passing(a, 8080),
				inst(gone, 8080, consul.StatusCritical, OutputNotReady),
				inst(notReady, 8080, consul.StatusCritical, OutputNotReady)},
		},
		{
			name:   "window annotation",
			svc:    newSvc([]k8s.Endpoint{a}, withAnn(AnnotationWindow, "250ms")),
			want:   []consul.Instance{passing(a, 8080)},
			window: 250 * time.Millisecond,
		},
		{
			name:   "window zero",
			svc:    newSvc([]k8s.Endpoint{a}, withAnn(AnnotationWindow, "0")),
			want:   []consul.Instance{passing(a, 8080)},
			window: 0,
		},
		{
			name:     "invalid window: warning, default used",
			svc:      newSvc([]k8s.Endpoint{a}, withAnn(AnnotationWindow, "soon")),
			want:     []consul.Instance{passing(a, 8080)},
			window:   time.Second,
			warnings: []string{`service shop/web: annotation fleetsync.io/window="soon": is not a Go duration`},
		},
		{
			name:     "window over an hour: warning, default used",
			svc:      newSvc([]k8s.Endpoint{a}, withAnn(AnnotationWindow, "2h")),
			want:     []consul.Instance{passing(a, 8080)},
			window:   time.Second,
			warnings: []string{"must be between 0 and 1h0m0s; using the default 1s"},
		},
		{
			name: "service-sync false still computes (selection is the supervisor's)",
			svc:  newSvc([]k8s.Endpoint{a}, withAnn(AnnotationSync, " False ")),
			want: []consul.Instance{passing(a, 8080)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			before := cloneSvc(tt.svc)
			spec, err := Desired(tt.svc, cfg)
			if err != nil {
				t.Fatalf("Desired: %v", err)
			}
			wantName := tt.wantName
			if wantName == "" {
				wantName = testName
			}
			if spec.Name != wantName {
				t.Errorf("Name = %q, want %q", spec.Name, wantName)
			}
			wantWindow := tt.window
			if wantWindow == 0 && !strings.HasPrefix(tt.name, "window zero") {
				wantWindow = time.Second
			}
			if spec.Window != wantWindow {
				t.Errorf("Window = %v, want %v", spec.Window, wantWindow)
			}
			if !reflect.DeepEqual(spec.Instances, tt.want) {
				t.Errorf("Instances:\n got %+v\nwant %+v", spec.Instances, tt.want)
			}
			if len(spec.Warnings) != len(tt.warnings) {
				t.Fatalf("Warnings = %q, want %d", spec.Warnings, len(tt.warnings))
			}
			for i, w := range tt.warnings {
				if !strings.Contains(spec.Warnings[i], w) {
					t.Errorf("warning %q does not contain %q", spec.Warnings[i], w)
				}
			}
			for _, in := range spec.Instances {
				if err := cfg.Cluster.Stamped(in); err != nil {
					t.Error(err)
				}
			}
			if !reflect.DeepEqual(tt.svc, before) {
				t.Error("Desired modified its input")
			}
		})
	}
}

// reserveClusters is a Config.ReservedTag naming the given cluster ids.
func reserveClusters(ids ...string) func(string) (string, bool) {
	return func(tag string) (string, bool) {
		if slices.Contains(ids, tag) {
			return tag, true
		}
		return "", false
	}
}

// TestDesiredInstancesShareNothing: instances never share a tag slice or a
// meta map (a caller editing one must not edit another).
func TestDesiredInstancesShareNothing(t *testing.T) {
	svc := newSvc([]k8s.Endpoint{ready("10.0.0.1", "a"), ready("10.0.0.2", "b")}, withAnn(AnnotationTags, "x,y"))
	spec, err := Desired(svc, testConfig(t))
	if err != nil || len(spec.Instances) != 2 {
		t.Fatalf("Desired: %v, %d instances", err, len(spec.Instances))
	}
	spec.Instances[0].Tags[0] = "changed"
	spec.Instances[0].Meta["team"] = "changed"
	if spec.Instances[1].Tags[0] != "k8s" || spec.Instances[1].Meta["team"] != "" {
		t.Errorf("instances share tags or meta: %+v", spec.Instances[1])
	}
}

// TestDesiredDeterministic: the same view gives the same spec, whatever the
// order of its endpoints, and IDs follow ownership.Cluster.InstanceID.
func TestDesiredDeterministic(t *testing.T) {
	eps := []k8s.Endpoint{ready("10.0.0.3", "c"), ready("10.0.0.1", "a"), ready("fd00::2", "d"), ready("10.0.0.2", "b")}
	cfg := testConfig(t)
	first, err := Desired(newSvc(eps), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		shuffled := slices.Clone(eps)
		slices.Reverse(shuffled)
		shuffled[0], shuffled[i%len(shuffled)] = shuffled[i%len(shuffled)], shuffled[0]
		again, err := Desired(newSvc(shuffled), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(first, again) {
			t.Fatalf("order %d: spec differs:\n%+v\n%+v", i, first, again)
		}
	}
	for _, in := range first.Instances {
		if want := cfg.Cluster.InstanceID(testNS, testName, in.Address, in.Port); in.ID != want {
			t.Errorf("ID %q, want %q", in.ID, want)
		}
	}
	other := cfg
	other.Cluster, err = ownership.New("west")
	if err != nil {
		t.Fatal(err)
	}
	west, err := Desired(newSvc(eps), other)
	if err != nil {
		t.Fatal(err)
	}
	for i := range west.Instances {
		if west.Instances[i].ID == first.Instances[i].ID {
			t.Errorf("clusters east and west share instance ID %q", west.Instances[i].ID)
		}
		if west.Instances[i].Meta["k8s-cluster"] != "west" || !slices.Contains(west.Instances[i].Tags, "west") {
			t.Errorf("west instance lacks its mark: %+v", west.Instances[i])
		}
	}
}

func TestDesiredErrors(t *testing.T) {
	a := ready("10.0.0.1", "a")
	manyMeta := func(n int) svcOpt {
		return func(s *k8s.Service) {
			for i := 0; i < n; i++ {
				s.Annotations[fmt.Sprintf("%sk%d", AnnotationMeta, i)] = "v"
			}
		}
	}
	tests := []struct {
		name       string
		svc        *k8s.Service
		cfg        func(*Config)
		annotation string
		reason     string
	}{
		{name: "service-sync garbage", svc: newSvc(nil, withAnn(AnnotationSync, "yes please")),
			annotation: AnnotationSync, reason: `must be "true" or "false"`},
		{name: "service-sync empty", svc: newSvc(nil, withAnn(AnnotationSync, "")),
			annotation: AnnotationSync, reason: `must be "true" or "false"`},
		{name: "service-name empty", svc: newSvc(nil, withAnn(AnnotationName, " ")),
			annotation: AnnotationName, reason: "must not be empty"},
		{name: "service-name not a DNS label", svc: newSvc(nil, withAnn(AnnotationName, "web_api")),
			cfg:        func(c *Config) { c.StrictAnnotations = true },
			annotation: AnnotationName, reason: "must be a DNS label"},
		{name: "service-name too long", svc: newSvc(nil, withAnn(AnnotationName, strings.Repeat("a", 64))),
			cfg:        func(c *Config) { c.StrictAnnotations = true },
			annotation: AnnotationName, reason: "at most 63"},
		{name: "prefixed name too long", svc: newSvc(nil), cfg: func(c *Config) { c.ServicePrefix = strings.Repeat("p", 61); c.StrictAnnotations = true },
			annotation: "(none: name from --service-prefix and metadata.name)", reason: "at most 63"},
		{name: "service-port name not in spec", svc: newSvc([]k8s.Endpoint{a}, withAnn(AnnotationPort, "grpc")),
			cfg:        func(c *Config) { c.StrictAnnotations = true },
			annotation: AnnotationPort, reason: `no port named "grpc" in spec.ports`},
		{name: "service-name over 255", svc: newSvc(nil, withAnn(AnnotationName, strings.Repeat("a", 256))),
			annotation: AnnotationName, reason: "at most 255"},
		{name: "service-name not UTF-8", svc: newSvc(nil, withAnn(AnnotationName, "w\xffb")),
			annotation: AnnotationName, reason: "not valid UTF-8"},
		{name: "prefixed name over 255", svc: newSvc(nil), cfg: func(c *Config) { c.ServicePrefix = strings.Repeat("p", 253) },
			annotation: "(none: name from --service-prefix and metadata.name)", reason: "at most 255"},
		{name: "service-port name and no ports", svc: newSvc([]k8s.Endpoint{a}, withAnn(AnnotationPort, "grpc"), func(s *k8s.Service) { s.Ports = nil }),
			annotation: AnnotationPort, reason: `no port named "grpc" in spec.ports`},
		{name: "service-port garbage", svc: newSvc([]k8s.Endpoint{a}, withAnn(AnnotationPort, "http/80")),
			annotation: AnnotationPort, reason: "neither a port number nor a valid port name"},
		{name: "service-port out of range", svc: newSvc([]k8s.Endpoint{a}, withAnn(AnnotationPort, "70000")),
			annotation: AnnotationPort, reason: "out of range"},
		{name: "no ports and no service-port", svc: newSvc([]k8s.Endpoint{a}, func(s *k8s.Service) { s.Ports = nil }),
			annotation: "spec.ports", reason: "has no ports"},
		{name: "service-tags non-UTF-8", svc: newSvc(nil, withAnn(AnnotationTags, "a,\xff")),
			annotation: AnnotationTags, reason: "not valid UTF-8"},
		{name: "service-tags too many", svc: newSvc(nil, withAnn(AnnotationTags, nTags(129))),
			annotation: AnnotationTags, reason: "has 129 tags"},
		{name: "meta reserved key", svc: newSvc(nil, withAnn(AnnotationMeta+MetaPod, "x")),
			annotation: AnnotationMeta + MetaPod, reason: "set by fleetsync"},
		{name: "meta ownership key", svc: newSvc(nil, withAnn(AnnotationMeta+"k8s-cluster", "west")),
			annotation: AnnotationMeta + "k8s-cluster", reason: "set by fleetsync"},
		{name: "meta consul- key", svc: newSvc(nil, withAnn(AnnotationMeta+"consul-version", "x")),
			annotation: AnnotationMeta + "consul-version", reason: "reserved by Consul"},
		{name: "meta empty key", svc: newSvc(nil, withAnn(AnnotationMeta, "x")),
			annotation: AnnotationMeta, reason: "may only contain"},
		{name: "meta value too long", svc: newSvc(nil, withAnn(AnnotationMeta+"team", strings.Repeat("v", 600))),
			annotation: AnnotationMeta + "team", reason: "600 characters long"},
		{name: "meta too many keys", svc: newSvc(nil, manyMeta(58)),
			annotation: AnnotationMeta + "*", reason: "at most 57 user meta keys"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			spec, err := Desired(tt.svc, cfg)
			var ae *AnnotationError
			if !errors.As(err, &ae) {
				t.Fatalf("error %T %v, want an *AnnotationError", err, err)
			}
			if ae.Service != "shop/web" || ae.Annotation != tt.annotation || !strings.Contains(ae.Reason, tt.reason) {
				t.Errorf("got %+v, want annotation %q and reason containing %q", ae, tt.annotation, tt.reason)
			}
			if msg := err.Error(); !strings.Contains(msg, "shop/web") || !strings.Contains(msg, tt.annotation) {
				t.Errorf("message %q does not name the Service and annotation", msg)
			}
			if len(spec.Instances) != 0 {
				t.Errorf("instances returned with an error: %+v", spec.Instances)
			}
		})
	}
}

// TestDesiredMetaLimit: exactly the allowed number of user meta keys passes.
func TestDesiredMetaLimit(t *testing.T) {
	svc := newSvc([]k8s.Endpoint{ready("10.0.0.1", "a")})
	want := passing(ready("10.0.0.1", "a"), 8080).Meta
	for i := 0; i < maxMetaPairs-len(reservedMeta); i++ {
		svc.Annotations[fmt.Sprintf("%sk%d", AnnotationMeta, i)] = "v"
		want[fmt.Sprintf("k%d", i)] = "v"
	}
	spec, err := Desired(svc, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Instances[0].Meta; len(got) != maxMetaPairs || !maps.Equal(got, want) {
		t.Errorf("meta has %d pairs, want %d:\n got %v\nwant %v", len(got), maxMetaPairs, got, want)
	}
}
