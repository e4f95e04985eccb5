package consul

import (
	"errors"
	"slices"
	"testing"

	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/consul/namespaces"
)

// TestApplyCreatesNamespaces: on the twin with Consul Enterprise's
// namespaces (a write into a missing namespace fails, as there), a Client
// with mirroring creates each Kubernetes namespace's mirror before its
// first write into it, once; without Options.Namespaces the same write
// fails; when the namespaces are gone (Consul lost its data), the failed
// transaction makes the next Apply create them again.
func TestApplyCreatesNamespaces(t *testing.T) {
	ctx := t.Context()
	owner := testOwner{id: "ns"}
	in := func(i int, k8sNS string) Instance {
		x := owner.instance(i, "web")
		x.Meta["k8s-namespace"] = k8sNS
		return x
	}
	scope := Scope{MirrorNamespaces: true, MirrorPrefix: "k8s-"}

	t.Run("without the ensurer the write fails", func(t *testing.T) {
		twin := consultest.New(t)
		twin.EnableNamespaces()
		c := NewClient(twin.Client(), owner, Options{Scope: scope})
		if _, err := c.Apply(ctx, Change{Register: []Instance{in(1, "shop")}}); err == nil {
			t.Fatal("a write into a missing namespace succeeded on the twin")
		}
	})

	twin := consultest.New(t)
	nss := twin.EnableNamespaces("k8s-existing")
	ens := namespaces.New(twin.Client().Namespaces(), namespaces.Options{CrossNamespacePolicy: "cross-namespace-policy"})
	c := NewClient(twin.Client(), owner, Options{Scope: scope, Namespaces: ens})
	applied, err := c.Apply(ctx, Change{Register: []Instance{in(1, "shop"), in(2, "shop"), in(3, "pay"), in(4, "existing")}})
	if err != nil || applied.Registered != 4 {
		t.Fatalf("apply: %+v, %v", applied, err)
	}
	if got := nss.Names(); !slices.Equal(got, []string{"k8s-existing", "k8s-pay", "k8s-shop"}) {
		t.Fatalf("namespaces %q", got)
	}
	shop, _ := nss.Get("k8s-shop")
	if shop.Meta["external-source"] != "kubernetes" || shop.ACLs == nil || len(shop.ACLs.PolicyDefaults) != 1 ||
		shop.ACLs.PolicyDefaults[0].Name != "cross-namespace-policy" {
		t.Fatalf("created namespace %+v", shop)
	}
	var creates int
	for _, r := range nss.Requests() {
		if r.Method == "PUT" {
			creates++
		}
	}
	if creates != 2 || len(nss.Requests()) != 5 {
		t.Fatalf("requests %+v: want 3 reads and 2 creates (k8s-existing exists)", nss.Requests())
	}
	// Known namespaces cost nothing more.
	if _, err := c.Apply(ctx, Change{Register: []Instance{in(5, "shop")}}); err != nil {
		t.Fatal(err)
	}
	if n := len(nss.Requests()); n != 5 {
		t.Fatalf("%d namespace requests after a write into a known namespace, want still 5", n)
	}

	// Consul loses its data: the namespaces are gone with the catalog.
	twin.Wipe()
	_, err = c.Apply(ctx, Change{Register: []Instance{in(6, "shop")}})
	var te *TxnError
	if !errors.As(err, &te) {
		t.Fatalf("first write after the loss: %v, want the transaction refused", err)
	}
	if _, err := c.Apply(ctx, Change{Register: []Instance{in(6, "shop")}}); err != nil {
		t.Fatalf("second write after the loss: %v", err)
	}
	if got := nss.Names(); !slices.Equal(got, []string{"k8s-shop"}) {
		t.Fatalf("namespaces after the loss and a write: %q", got)
	}
}
