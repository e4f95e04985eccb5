package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
)

// holdClaim takes cluster id's claim on c as a running fleetsync does (a
// key locked by a session) and returns its release: the session's end.
func holdClaim(t *testing.T, c *api.Client, id, holder string) (release func()) {
	t.Helper()
	sid, _, err := c.Session().Create(&api.SessionEntry{Name: "fleetsync " + id}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := json.Marshal(claim.Value{ClusterID: id, KubeUID: "uid-" + id, Holder: holder})
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: claim.DefaultPrefix + "/" + id, Value: v, Session: sid}, nil); err != nil || !ok {
		t.Fatalf("acquire the claim of %s: %t, %v", id, ok, err)
	}
	return func() {
		if _, err := c.Session().Destroy(sid, nil); err != nil {
			t.Error(err)
		}
	}
}

// TestPurgeToK8sClaim: purge --to-k8s deletes nothing while a running
// fleetsync holds the id's claim in Consul (it would make the objects
// again), as purge of Consul entries refuses; the dry run still lists and
// says so; --wait-released deletes once the claim is let go; Consul not
// answering deletes nothing; a fleetsync that takes the claim while purge
// deletes is reported.
func TestPurgeToK8sClaim(t *testing.T) {
	mark, err := k8smark.New("east")
	if err != nil {
		t.Fatal(err)
	}
	twin := consultest.New(t)
	c := twin.Client()
	run := func(t *testing.T, yes bool, wait time.Duration, clk clock.Clock, reactors ...k8stesting.ReactionFunc) (deletes int, out string, err error) {
		kube := fake.NewClientset(markedObjects(t)...)
		for _, r := range reactors {
			kube.PrependReactor("delete", "*", r)
		}
		var b bytes.Buffer
		err = toK8sPurge{kube: kube, mark: mark, claim: claimPlan(c, east, ""), wait: wait, clk: clk, yes: yes}.run(t.Context(), &b)
		for _, a := range kube.Actions() {
			if a.GetVerb() == "delete" {
				deletes++
			}
		}
		return deletes, b.String(), err
	}
	const refusal = `refusing: cluster id east is claimed by a running fleetsync (holder "fleetsync-0", Kubernetes cluster uid-east); stop it first`
	release := holdClaim(t, c, "east", "fleetsync-0")

	t.Run("held: yes refused", func(t *testing.T) {
		n, out, err := run(t, true, 0, clock.RealClock{})
		if err == nil || err.Error() != refusal || n != 0 || out != "" {
			t.Errorf("%d deletes, error %v, output %q; want the refusal and nothing deleted", n, err, out)
		}
	})
	t.Run("held: dry run lists", func(t *testing.T) {
		n, out, err := run(t, false, time.Minute, clock.RealClock{})
		if err != nil || n != 0 || !strings.HasPrefix(out, "Would delete 4 Kubernetes objects carrying cluster east's to-k8s mark") ||
			!strings.Contains(out, "With --yes now: "+refusal+".\nDry run: nothing changed.") {
			t.Errorf("%d deletes, error %v, output:\n%s", n, err, out)
		}
	})
	t.Run("held: wait-released", func(t *testing.T) {
		clk := timerClock{testingclock.NewFakeClock(time.Unix(1000, 0)), make(chan time.Duration)}
		type result struct {
			n   int
			out string
			err error
		}
		done := make(chan result, 1)
		go func() {
			n, out, err := run(t, true, time.Minute, clk)
			done <- result{n, out, err}
		}()
		var r result
		select {
		case d := <-clk.timers: // purge waits for the claim
			release()
			clk.Step(d)
			r = <-done
		case r = <-done:
			t.Fatalf("returned without waiting: %d deletes, %v, %q", r.n, r.err, r.out)
		}
		if r.err != nil || r.n != 4 || !strings.HasPrefix(r.out, `Waiting up to 1m0s for the fleetsync holding cluster id east (holder "fleetsync-0") to stop...`) ||
			!strings.HasSuffix(r.out, "Deleted 4 of 4 objects.\n") {
			t.Errorf("%d deletes, error %v, output:\n%s", r.n, r.err, r.out)
		}
	})
	t.Run("consul not answering", func(t *testing.T) {
		twin.SetFault(func(*http.Request) error { return errors.New("no leader") })
		defer twin.SetFault(nil)
		if n, _, err := run(t, true, 0, clock.RealClock{}); err == nil || !strings.Contains(err.Error(), "read the claim of cluster east") || n != 0 {
			t.Errorf("%d deletes, error %v", n, err)
		}
	})
	t.Run("claimed meanwhile", func(t *testing.T) {
		// A fleetsync of the id starts while purge deletes.
		took := false
		start := func(k8stesting.Action) (bool, runtime.Object, error) {
			if !took {
				took = true
				holdClaim(t, c, "east", "fleetsync-1")
			}
			return false, nil, nil
		}
		n, out, err := run(t, true, 0, clock.RealClock{}, start)
		if n != 4 || err == nil || !strings.Contains(err.Error(), `a fleetsync took the claim of cluster id east while purge ran (holder "fleetsync-1")`) ||
			!strings.HasSuffix(out, "Deleted 4 of 4 objects.\n") {
			t.Errorf("%d deletes, error %v, output:\n%s", n, err, out)
		}
	})
}
