package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/ownership"
)

// startWithScope runs the daemon's start (consulConn.start) against the
// Consul at addr with scope, and returns its error.
func startWithScope(t *testing.T, addr string, scope consul.Scope) error {
	t.Helper()
	cfg := config{ClusterID: "east", CrossNSPolicy: "cross-namespace-policy", ConsulTimeout: 5 * time.Second, ClaimPrefix: "fleetsync/clusters"}
	cn, err := conn.Open(conn.Config{Addresses: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	cc := &consulConn{Conn: cn, scope: scope}
	cc.namespaces = newNamespaceEnsurer(cfg, cn, scope, hclog.NewNullLogger())
	cluster, err := ownership.New(cfg.ClusterID)
	if err != nil {
		t.Fatal(err)
	}
	store := consul.NewConnClient(cn, cluster, consul.Options{Scope: scope, Namespaces: cc.namespaceEnsurer()})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = cc.start(ctx, cfg, store, nil, hclog.NewNullLogger())
	if ctx.Err() != nil {
		t.Fatalf("start still retrying after 10s (last error %v)", err)
	}
	return err
}

// TestStartEnsuresTheNamespace: at start, the namespace every instance and
// the cluster-id claim go in (--consul-namespace) is created when missing,
// with the cross-namespace policy; with mirroring nothing is created at
// start (each namespace at its first write); the default namespace is
// never asked for.
func TestStartEnsuresTheNamespace(t *testing.T) {
	cases := []struct {
		scope consul.Scope
		want  []string
	}{
		{scope: consul.Scope{Namespace: "team-a"}, want: []string{"team-a"}},
		{scope: consul.Scope{Namespace: "team-a", Partition: "part-1"}, want: []string{"team-a"}},
		{scope: consul.Scope{MirrorNamespaces: true, MirrorPrefix: "k8s-"}},
		{scope: consul.Scope{Namespace: "default"}},
	}
	for _, c := range cases {
		twin := consultest.New(t)
		nss := twin.EnableNamespaces()
		if err := startWithScope(t, twin.Addr(), c.scope); err != nil {
			t.Fatalf("%+v: %v", c.scope, err)
		}
		if got := nss.Names(); !slices.Equal(got, c.want) {
			t.Fatalf("%+v: namespaces %q, want %q", c.scope, got, c.want)
		}
		if len(c.want) > 0 {
			ns, _ := nss.Get(c.want[0])
			if ns.ACLs == nil || len(ns.ACLs.PolicyDefaults) != 1 || ns.ACLs.PolicyDefaults[0].Name != "cross-namespace-policy" {
				t.Fatalf("%+v: namespace %+v, want the cross-namespace policy as its default", c.scope, ns)
			}
			reqs := nss.Requests()
			if c.scope.Partition != "" && !strings.Contains(reqs[len(reqs)-1].Query, "partition="+c.scope.Partition) {
				t.Fatalf("%+v: create %+v, want it in the partition", c.scope, reqs[len(reqs)-1])
			}
		}
	}
}

// TestStartStopsWhenTheNamespaceCannotBeMade: a token that may not create
// the namespace, or a Consul without namespaces, stops the start at once
// with an error saying so (no retry loop).
func TestStartStopsWhenTheNamespaceCannotBeMade(t *testing.T) {
	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			http.NotFound(w, r)
			return
		}
		http.Error(w, "Permission denied", http.StatusForbidden)
	}))
	defer forbidden.Close()
	err := startWithScope(t, forbidden.Listener.Addr().String(), consul.Scope{Namespace: "team-a"})
	if !errors.Is(err, conn.ErrNotPermitted) || !strings.Contains(err.Error(), `"team-a"`) || !strings.Contains(err.Error(), "operator:write") {
		t.Fatalf("err = %v, want ErrNotPermitted naming the namespace and operator:write", err)
	}
	oss := consultest.New(t) // no namespaces: /v1/namespace is not served
	err = startWithScope(t, oss.Addr(), consul.Scope{Namespace: "team-a"})
	if !errors.Is(err, conn.ErrEnterpriseOnly) {
		t.Fatalf("err = %v, want ErrEnterpriseOnly", err)
	}
}
