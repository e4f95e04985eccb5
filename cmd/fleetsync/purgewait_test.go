package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul/admin"
	"github.com/fleetsync/fleetsync/consul/claim"
)

// timerClock is a fake clock that says on timers when a timer is made, so
// that the test steps it only once the waiter exists.
type timerClock struct {
	*testingclock.FakeClock
	timers chan time.Duration
}

func (c timerClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	c.timers <- d
	return t
}

// TestPlanWhenReleased: purge --wait-released reads the plan again every
// poll while the claim is held, returns the first plan without it, and
// after the wait the refusal; without a wait it reads once.
func TestPlanWhenReleased(t *testing.T) {
	held := admin.PurgePlan{Cluster: east, Claim: &claim.Value{Holder: "fleetsync-0"}, ClaimHeld: true}
	free := admin.PurgePlan{Cluster: east, Claim: &claim.Value{Holder: "fleetsync-0"}}
	run := func(wait time.Duration, heldFor int) (polls []time.Duration, reads int, p admin.PurgePlan, out string, err error) {
		clk := timerClock{testingclock.NewFakeClock(time.Unix(1000, 0)), make(chan time.Duration)}
		var buf bytes.Buffer
		plan := func(context.Context) (admin.PurgePlan, error) {
			reads++
			if reads <= heldFor {
				return held, nil
			}
			return free, nil
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			p, err = planWhenReleased(t.Context(), plan, wait, clk, &buf)
		}()
		for {
			select {
			case d := <-clk.timers:
				polls = append(polls, d)
				clk.Step(d)
				continue
			case <-done:
			}
			return polls, reads, p, buf.String(), err
		}
	}

	polls, reads, p, out, err := run(10*time.Second, 2)
	if err != nil || p.ClaimHeld || reads != 3 || len(polls) != 2 || polls[0] != releasedPoll {
		t.Errorf("released after two polls: %+v, %v, %d reads, polls %v", p, err, reads, polls)
	}
	if strings.Count(out, "Waiting up to 10s for the fleetsync holding cluster id east (holder \"fleetsync-0\")") != 1 {
		t.Errorf("output %q, want the wait said once", out)
	}

	polls, reads, _, _, err = run(5*time.Second, 100)
	if err == nil || !strings.Contains(err.Error(), "refusing: cluster id east is claimed") || reads != 4 ||
		len(polls) != 3 || polls[2] != time.Second {
		t.Errorf("never released: %v, %d reads, polls %v; want the refusal after reads at 0, 2, 4 and 5 s", err, reads, polls)
	}

	polls, reads, _, out, err = run(0, 100)
	if err == nil || reads != 1 || len(polls) != 0 || out != "" {
		t.Errorf("no wait: %v, %d reads, polls %v, output %q", err, reads, polls, out)
	}
}
