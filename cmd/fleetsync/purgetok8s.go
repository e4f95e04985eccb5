package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/consul/api"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul/admin"
	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/k8s/apply"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
)

// toK8sPurge is one `fleetsync purge --to-k8s`: the Kubernetes objects
// carrying one cluster id's to-k8s mark, listed, and with yes deleted. The
// deletion is refused, as purge's of Consul entries, while a running
// fleetsync holds the id's claim in Consul: it would make the objects
// again. The dry run reads the claim once and says so; with yes the claim
// is read until released for at most wait (planWhenReleased), and once
// more after the deletes.
type toK8sPurge struct {
	kube  kubernetes.Interface
	mark  k8smark.Mark
	claim func(context.Context) (admin.PurgePlan, error) // the id's claim as a plan: Claim and ClaimHeld
	wait  time.Duration
	clk   clock.Clock
	yes   bool
}

// claimPlan reads cluster's claim under prefix ("" for the default) into
// a purge plan that holds only the claim: what Refusal needs.
func claimPlan(c *api.Client, cluster ownership.Cluster, prefix string) func(context.Context) (admin.PurgePlan, error) {
	return func(ctx context.Context) (admin.PurgePlan, error) {
		v, held, err := claim.Read(ctx, c, prefix, cluster.ID())
		if err != nil {
			return admin.PurgePlan{}, fmt.Errorf("read the claim of cluster %s: %w", cluster.ID(), err)
		}
		return admin.PurgePlan{Cluster: cluster, Claim: v, ClaimHeld: held}, nil
	}
}

func (p toK8sPurge) run(ctx context.Context, out io.Writer) error {
	id := p.mark.Cluster()
	var refusal error
	if p.yes {
		if _, err := planWhenReleased(ctx, p.claim, p.wait, p.clk, out); err != nil {
			return err
		}
	} else {
		plan, err := p.claim(ctx)
		if err != nil {
			return err
		}
		refusal = plan.Refusal()
	}
	ms, err := listMirrored(ctx, p.kube, p.mark.Selector())
	if err != nil {
		return err
	}
	objects := 0
	for _, m := range ms {
		objects += len(m.slices)
		if m.svc != nil {
			objects++
		}
	}
	verb := "Would delete"
	if p.yes {
		verb = "Deleting"
	}
	fmt.Fprintf(out, "%s %d Kubernetes objects carrying cluster %s's to-k8s mark (%s):\n", verb, objects, id, p.mark.Selector())
	if err := writeMirroredTable(out, ms); err != nil {
		return err
	}
	if !p.yes {
		if refusal != nil {
			fmt.Fprintf(out, "With --yes now: %v.\n", refusal)
		}
		fmt.Fprintf(out, "Dry run: nothing changed. Stop every fleetsync running with --cluster-id=%s, then run again with --yes.\n", id)
		return nil
	}
	w, err := apply.New(p.kube, p.mark, apply.Options{QPS: 20, Burst: 40})
	if err != nil {
		return err
	}
	n, err := purgeMirrored(ctx, w, ms)
	fmt.Fprintf(out, "Deleted %d of %d objects.\n", n, objects)
	if err != nil {
		return err
	}
	after, err := p.claim(ctx)
	if err != nil {
		return err
	}
	if after.Refusal() != nil {
		return fmt.Errorf("a fleetsync took the claim of cluster id %s while purge ran (holder %q): it makes the objects again; stop it and run purge again",
			id, after.Claim.Holder)
	}
	return nil
}

// purgeToK8s is `fleetsync purge --to-k8s`: it reads the claim in the
// Consul of the Consul flags and deletes through the Kubernetes API of
// --kubeconfig/--context.
func purgeToK8s(ctx context.Context, cfg config, cluster ownership.Cluster, yes bool, wait time.Duration, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, "fleetsync purge --to-k8s:", err)
		return 1
	}
	mark, err := k8smark.New(cluster.ID())
	if err != nil {
		return fail(err)
	}
	kube, err := kubeClient(cfg)
	if err != nil {
		return fail(err)
	}
	conn, logout, err := openConsul(ctx, cfg, true)
	if err != nil {
		return fail(err)
	}
	defer logout()
	p := toK8sPurge{kube: kube, mark: mark, claim: claimPlan(conn.API(), cluster, cfg.ClaimPrefix), wait: wait, clk: clock.RealClock{}, yes: yes}
	if err := p.run(ctx, stdout); err != nil {
		return fail(err)
	}
	return 0
}
