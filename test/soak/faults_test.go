package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/test/stack"
)

// TestRestoreDoesNotPlantAnUndoneTamperAgain: after a snapshot restore, a
// tampered entry the restore undid, over which fleetsync has since
// written its own entry, is not planted again (that write would land
// over fleetsync's entry with no change of its Service to tell it, and
// the tamper's removal would be a delete fleetsync never saw: found by
// the soak). A tampered entry the restore kept stays planted, untouched.
// Real Consul agent.
func TestRestoreDoesNotPlantAnUndoneTamperAgain(t *testing.T) {
	ctx := context.Background()
	var log bytes.Buffer
	w := &world{ctx: ctx, start: time.Now(), logw: &log, consul: stack.ConsulT(t), plantedNodes: map[string]bool{}}
	w.chk = newChecker(w, 30*time.Second)
	cl, err := w.consulClient()
	if err != nil {
		t.Fatal(err)
	}
	const node = "k8s-alpha"
	ours := func(id, addr string) *consulapi.CatalogRegistration {
		return &consulapi.CatalogRegistration{Node: node, Address: "127.0.0.1",
			NodeMeta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "alpha"},
			Service: &consulapi.AgentService{ID: id, Service: "svc-077", Address: addr, Port: servicePort,
				Tags: []string{"k8s", "alpha"}, Meta: map[string]string{"external-source": "kubernetes", "k8s-cluster": "alpha"}}}
	}
	tamper := func(id, addr string) uint64 {
		reg := &consulapi.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
			Service: &consulapi.AgentService{ID: id, Service: "svc-077", Address: addr, Port: servicePort, Tags: []string{"tampered"}}}
		idx, err := register(ctx, cl, reg)
		if err != nil {
			t.Fatal(err)
		}
		f := w.chk.faultStart("tampered-entry", id, nil)
		w.tampered = append(w.tampered, tamperRec{node, id})
		w.chk.plant(&planted{What: "tampered entry " + id, Node: node, ID: id, ModifyIndex: idx, Fault: f, reg: reg})
		return idx
	}
	undone, kept := "k8s_alpha_soak-alpha_svc-077_10.10.0.193_8080", "k8s_alpha_soak-alpha_svc-077_10.10.0.194_8080"
	for _, r := range []*consulapi.CatalogRegistration{ours(undone, "10.10.0.193"), ours(kept, "10.10.0.194")} {
		if _, err := register(ctx, cl, r); err != nil {
			t.Fatal(err)
		}
	}
	tamper(undone, "10.10.0.193")
	keptIdx := tamper(kept, "10.10.0.194")

	// The restore took `undone` back to fleetsync's entry, and fleetsync
	// has written its own since; `kept` is as tampered.
	w.chk.pausePlanted()
	oursIdx, err := register(ctx, cl, ours(undone, "10.10.0.193"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.afterRestore(ctx); err != nil {
		t.Fatal(err)
	}

	list, _, err := cl.Catalog().NodeServiceList(node, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*consulapi.AgentService{}
	for _, s := range list.Services {
		got[s.ID] = s
	}
	if s := got[undone]; s == nil || markOf(s) != "alpha" || s.ModifyIndex != oursIdx {
		t.Errorf("fleetsync's entry %s after the restore was written over: %+v (want marked, at index %d)", undone, s, oursIdx)
	}
	if w.chk.isPlanted(node, undone) {
		t.Errorf("the undone tamper of %s is still planted", undone)
	}
	if s := got[kept]; s == nil || markOf(s) != "" || s.ModifyIndex != keptIdx {
		t.Errorf("the tamper the restore kept, %s, changed: %+v (want unmarked, at index %d)", kept, s, keptIdx)
	}
	if !w.chk.isPlanted(node, kept) {
		t.Errorf("the tamper the restore kept, %s, is no longer planted", kept)
	}
	if w.chk.plantGen%2 != 0 {
		t.Error("the planted-entry check did not resume")
	}
}
